// SPDX-License-Identifier: GPL-2.0
/* XAgg XDP aggregator: sums every worker's share of a chunk into the job's
 * whole-gradient cache and sends the finished chunk back to all workers. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "xagg_structs.h"
#include "xagg_maps.h"
#include "xagg_parse.h"

/* Set by the loader before the program is loaded. */
const volatile __u16 xagg_udp_port = 9987;
/* CPUs 0 .. n-1 send results (xagg_result_cpus); 0: each result leaves by
 * XDP_TX on the CPU that completed its chunk. */
const volatile __u32 xagg_fan_out_cpus = 0;

enum cell_outcome {
	CELL_ADDED,
	CELL_COMPLETED,
	CELL_DUPLICATE,
	CELL_RESEND,
	CELL_STALE,
	CELL_OP_MISMATCH,
	CELL_LENGTH_MISMATCH,
	CELL_CONTENDED,
	CELL_PAYLOAD_ERROR, /* the packet's payload could not be read or written */
};

/* Attempts before a packet is dropped as contended (recovered by the sender's
 * retransmission). A merge holds a cell for about a microsecond. */
#define CELL_LOCK_ATTEMPTS (1 << 16)

/* Shares are added by a loop over blocks of this many elements, each block
 * unrolled. A short share's last block adds elements past its end, which
 * nothing reads (results carry only the share's own elements). Unrolling all
 * 2048 elements made a 22,839-instruction program that merged 20% slower in
 * the capacity bench than this 1,615-instruction one (instruction cache). */
#define MERGE_BLOCK_ELEMS XAGG_CELL_BLOCK_ELEMS
#define MERGE_BLOCKS (XAGG_CHUNK_ELEMS / MERGE_BLOCK_ELEMS)

/* Runs `body` for every element index i of the first `elems`, a block of
 * MERGE_BLOCK_ELEMS unrolled at a time (so up to the block's end). */
#define FOR_EACH_BLOCKED(elems, body)                                                                  \
	_Pragma("clang loop unroll(disable)") for (int block = 0; block < MERGE_BLOCKS &&              \
							    block * MERGE_BLOCK_ELEMS < (elems); block++) \
		_Pragma("clang loop unroll(full)") for (int i = block * MERGE_BLOCK_ELEMS;              \
							  i < (block + 1) * MERGE_BLOCK_ELEMS; i++) body

struct lock_attempt {
	struct xagg_chunk *cell;
	int locked; /* bpf_loop's count cannot tell success on the last attempt */
};

static long try_lock_cell(__u32 attempt, void *ctx)
{
	struct lock_attempt *lock = ctx;

	lock->locked = __sync_val_compare_and_swap(&lock->cell->busy, 0, 1) == 0;
	return lock->locked; /* 1 stops the loop */
}

/* What a completed (or re-requested) cell's RESULT carries besides its values. */
struct cell_result {
	__u8 echo;     /* XAGG_FLAG_CE or 0 */
	__u8 scatter;  /* a reduce-scatter chunk: values to `owner` alone */
	__u16 owner;
};

/* A 16-bit SUM's result lane (protocol.md section 11): sum / 2^shift rounded
 * to nearest, ties to even. Shares are 16-bit and the shift at least
 * ceil(log2 ranks), so the result fits 16 bits again; shift 0 (MAX, OR)
 * keeps the value. */
static __always_inline __s16 rescale(__s32 sum, __u32 shift)
{
	if (!shift)
		return sum;
	__s32 floor = sum >> shift; /* arithmetic: rounds toward -infinity */
	__s32 rest = sum - (floor << shift);

	return floor + ((rest + (floor & 1)) > (1 << (shift - 1)));
}

/* Adds (or takes the maximum of) `elems` int32 elements of the share into the cell. */
static __always_inline void combine(struct xagg_chunk *cell, const struct xagg_share *share, __u32 elems, __u32 op)
{
	if (op == XAGG_OP_SUM) {
		FOR_EACH_BLOCKED(elems, { cell->value[i] += share->value[i]; })
	} else {
		FOR_EACH_BLOCKED(elems, {
			if (share->value[i] > cell->value[i])
				cell->value[i] = share->value[i];
		})
	}
}

/* 16-bit lanes go through bpf_loop, one block of MERGE_BLOCK_ELEMS lanes per
 * step: the verifier checks a step once per cell class instead of every
 * block of every loop (unrolled as the int32 ones, they took it past its
 * million instructions). A step is bounded by its class's capacity, a
 * constant, so that every access into the cell is checked. */
enum lane_step {
	LANES_WIDEN,   /* cell := the share's lanes (a first share) */
	LANES_SUM,     /* cell += lanes */
	LANES_MAX,     /* cell := max(cell, lanes) */
	LANES_OR,      /* cell |= lanes */
	LANES_RESCALE, /* the share's lanes := rescale(cell, shift): the result */
};

struct lane_work {
	struct xagg_chunk *cell;
	struct xagg_share *share;
	__u32 step;  /* enum lane_step */
	__u32 shift; /* LANES_RESCALE */
};

#define LANE_STEP(class_name, capacity)                                                                  \
	static long lane_step_##class_name(__u32 block, void *ctx)                                     \
	{                                                                                             \
		struct lane_work *work = ctx;                                                         \
		struct xagg_chunk *cell = work->cell;                                                 \
		struct xagg_share *share = work->share;                                               \
		const __u32 shift = work->shift;                                                      \
                                                                                                      \
		__u32 first = block * MERGE_BLOCK_ELEMS;                                              \
		/* Bound the index itself: the verifier loses the bound of `block` over the product. */ \
		asm volatile("" : "+r"(first));                                                       \
		if (first > (capacity) - MERGE_BLOCK_ELEMS)                                           \
			return 1;                                                                     \
		switch (work->step) {                                                                 \
		case LANES_WIDEN:                                                                     \
			_Pragma("clang loop unroll(full)") for (int k = 0; k < MERGE_BLOCK_ELEMS; k++) \
				cell->value[first + k] = share->lanes[first + k];                     \
			break;                                                                        \
		case LANES_SUM:                                                                       \
			_Pragma("clang loop unroll(full)") for (int k = 0; k < MERGE_BLOCK_ELEMS; k++) \
				cell->value[first + k] += share->lanes[first + k];                    \
			break;                                                                        \
		case LANES_MAX:                                                                       \
			_Pragma("clang loop unroll(full)") for (int k = 0; k < MERGE_BLOCK_ELEMS; k++) \
				if (share->lanes[first + k] > cell->value[first + k])                 \
					cell->value[first + k] = share->lanes[first + k];             \
			break;                                                                        \
		case LANES_OR:                                                                        \
			_Pragma("clang loop unroll(full)") for (int k = 0; k < MERGE_BLOCK_ELEMS; k++) \
				cell->value[first + k] |= share->lanes[first + k];                    \
			break;                                                                        \
		default:                                                                              \
			_Pragma("clang loop unroll(full)") for (int k = 0; k < MERGE_BLOCK_ELEMS; k++) \
				share->lanes[first + k] = rescale(cell->value[first + k], shift);     \
			break;                                                                        \
		}                                                                                     \
		return 0;                                                                             \
	}

LANE_STEP(small, XAGG_CELL_ELEMS_SMALL)
LANE_STEP(medium, XAGG_CELL_ELEMS_MEDIUM)
LANE_STEP(large, XAGG_CELL_ELEMS_LARGE)
LANE_STEP(narrow_jumbo, XAGG_CELL_ELEMS_NARROW_JUMBO)

/* Runs `step` over the first `elems` lanes (whole blocks) of a cell of `capacity` elements. */
static __always_inline void lanes(struct xagg_chunk *cell, struct xagg_share *share, __u32 capacity, __u32 elems,
				  enum lane_step step, __u32 shift)
{
	struct lane_work work = {.cell = cell, .share = share, .step = step, .shift = shift};
	const __u32 blocks = (elems + MERGE_BLOCK_ELEMS - 1) / MERGE_BLOCK_ELEMS;

	switch (capacity) {
	case XAGG_CELL_ELEMS_SMALL:
		bpf_loop(blocks, lane_step_small, &work, 0);
		break;
	case XAGG_CELL_ELEMS_MEDIUM:
		bpf_loop(blocks, lane_step_medium, &work, 0);
		break;
	case XAGG_CELL_ELEMS_LARGE:
		bpf_loop(blocks, lane_step_large, &work, 0);
		break;
	default:
		bpf_loop(blocks, lane_step_narrow_jumbo, &work, 0);
		break;
	}
}

static __always_inline enum lane_step lane_step_of(__u32 op)
{
	return op == XAGG_OP_SUM ? LANES_SUM : op == XAGG_OP_MAX ? LANES_MAX : LANES_OR;
}

/* Writes a completed cell's values over the packet's payload: int32 as they
 * are, 16-bit lanes from their int32 cells (SUM rescaled by the job's shift). */
static __always_inline int store_result(struct xdp_md *ctx, __u32 payload_offset, __u32 payload_bytes,
					struct xagg_chunk *cell, struct xagg_share *share, __u32 narrow, __u32 capacity,
					__u32 sum_shift)
{
	if (!narrow)
		return bpf_xdp_store_bytes(ctx, payload_offset, cell->value, payload_bytes);
	lanes(cell, share, capacity, payload_bytes / 2, LANES_RESCALE, cell->op == XAGG_OP_SUM ? sum_shift : 0);
	return bpf_xdp_store_bytes(ctx, payload_offset, share->lanes, payload_bytes);
}

/* A cell lock of our own (a compare-and-swap, full barrier) rather than
 * bpf_spin_lock: the latter needs the inner map's BTF, see xagg_maps.h; being
 * our own, it may be held across the helper call that writes the result. The
 * loops are unrolled per block: constant offsets within it, no per-element
 * bounds checks. The payload at payload_offset may span fragments, so it is
 * copied: a first int32 share straight into the cell, a 16-bit one and a
 * later share into the per-CPU share buffer to be added from there, a
 * duplicate or stale one not at all. A completed (or re-requested) cell's
 * value is written back over it. */
static __always_inline enum cell_outcome
merge_into_cell(struct xdp_md *ctx, __u32 payload_offset, __u32 payload_bytes, __u32 narrow, struct xagg_chunk *cell,
		__u32 capacity, struct xagg_share *share, __u32 iteration, __u32 op, __u32 total, __u32 rank,
		const struct xagg_job *job, __u32 congested, __u8 data_flags, struct cell_result *result)
{
	const __u16 scatter = (data_flags & XAGG_FLAG_SCATTER) != 0;
	const int claims_owner = (data_flags & XAGG_FLAG_OWNER) != 0;
	struct lock_attempt lock = {.cell = cell, .locked = 0};
	const __u32 elems = narrow ? payload_bytes / 2 : payload_bytes / 4;
	const __u64 rank_bit = 1ULL << rank;
	enum cell_outcome outcome;

	bpf_loop(CELL_LOCK_ATTEMPTS, try_lock_cell, &lock, 0);
	if (!lock.locked)
		return CELL_CONTENDED;
	if (!cell->started || (__s32)(iteration - cell->iteration) > 0) {
		/* First share of a newer iteration: it becomes the cell's value. The
		 * helper checks the range before copying, so a failure leaves the
		 * cell as it was. */
		if (bpf_xdp_load_bytes(ctx, payload_offset, narrow ? (void *)share->lanes : (void *)cell->value,
				       payload_bytes)) {
			outcome = CELL_PAYLOAD_ERROR;
		} else {
			if (narrow)
				lanes(cell, share, capacity, elems, LANES_WIDEN, 0);
			cell->started = 1;
			cell->iteration = iteration;
			cell->op = op;
			cell->elems = elems;
			cell->total = total;
			cell->conflict_total = 0;
			cell->arrived = rank_bit;
			cell->congested = congested;
			cell->asked_again = 0;
			cell->scatter = scatter;
			cell->narrow = narrow;
			cell->owner = claims_owner ? rank : XAGG_NO_RANK;
			outcome = CELL_ADDED;
		}
	} else if (iteration != cell->iteration) {
		outcome = CELL_STALE;
	} else if (op != cell->op || scatter != cell->scatter || narrow != cell->narrow ||
		   (claims_owner && cell->owner != XAGG_NO_RANK && cell->owner != rank)) {
		/* A reduce-scatter chunk has one owner, and every share says it is one. */
		outcome = CELL_OP_MISMATCH;
	} else if (total != cell->total) {
		cell->conflict_total = total;
		cell->conflict_rank = rank;
		outcome = CELL_LENGTH_MISMATCH;
	} else if (elems != cell->elems) {
		outcome = CELL_LENGTH_MISMATCH;
	} else if (cell->arrived & rank_bit) {
		outcome = cell->arrived == job->full_mask ? CELL_RESEND : CELL_DUPLICATE;
	} else if (bpf_xdp_load_bytes(ctx, payload_offset, share, payload_bytes)) {
		outcome = CELL_PAYLOAD_ERROR;
	} else {
		if (narrow)
			lanes(cell, share, capacity, elems, lane_step_of(op), 0);
		else
			combine(cell, share, elems, op);
		cell->arrived |= rank_bit;
		cell->congested |= congested;
		if (claims_owner)
			cell->owner = rank;
		outcome = CELL_ADDED;
	}
	if (outcome == CELL_ADDED && cell->arrived == job->full_mask)
		outcome = CELL_COMPLETED;
	if (outcome == CELL_COMPLETED || outcome == CELL_RESEND) {
		result->echo = cell->congested || congested ? XAGG_FLAG_CE : 0;
		result->scatter = cell->scatter;
		result->owner = cell->owner;
	}
	if (outcome == CELL_RESEND)
		cell->asked_again |= rank_bit;
	if ((outcome == CELL_COMPLETED || outcome == CELL_RESEND) &&
	    store_result(ctx, payload_offset, payload_bytes, cell, share, narrow, capacity, job->sum_shift))
		outcome = CELL_PAYLOAD_ERROR;
	__sync_lock_test_and_set(&cell->busy, 0); /* release, full barrier */
	return outcome;
}

/* Turns the DATA packet, whose payload now holds the result, into a RESULT
 * packet from us to dst_ip:dst_port. veth leaves a partial UDP checksum, so
 * the checksum is cleared (allowed for UDP over IPv4). */
static __always_inline void make_result(struct xagg_packet *pkt, const __u8 dst_mac[ETH_ALEN],
					__be32 dst_ip, __be16 dst_port, __u8 flags)
{
	__u8 our_mac[ETH_ALEN];

	__builtin_memcpy(our_mac, pkt->eth->h_dest, ETH_ALEN);
	__builtin_memcpy(pkt->eth->h_dest, dst_mac, ETH_ALEN);
	__builtin_memcpy(pkt->eth->h_source, our_mac, ETH_ALEN);

	pkt->ip->saddr = pkt->ip->daddr;
	pkt->ip->daddr = dst_ip;
	pkt->ip->ttl = 64;
	/* The share's ECN field stays behind: the echo is in the header flags. */
	pkt->ip->tos &= ~XAGG_ECN_MASK;
	xagg_ipv4_csum(pkt->ip);

	pkt->udp->source = pkt->udp->dest;
	pkt->udp->dest = dst_port;
	pkt->udp->check = 0;

	pkt->hdr->type = XAGG_MSG_RESULT;
	/* The lane width stays: the payload keeps the share's (or the parent's RESULT's). */
	pkt->hdr->flags = flags | (pkt->hdr->flags & XAGG_FLAG_NARROW);
}

/* On veth everything after XDP_TX (the bridge flooding the result to every
 * worker, their receive processing) runs on the CPU that completed the
 * chunk, i.e. of the rank whose packet came last. With fan-out the result
 * goes to the next CPU's cpumap queue instead, and is sent from there. A
 * result for the tc fan-out (XDP_PASS: unicast jobs, reduce-scatter chunks)
 * goes to that CPU's queue of xagg_pass_cpus, which runs no program and
 * passes it to the stack there, where the tc program clones it to every rank. */
static __always_inline int send_result(int verdict)
{
	if (!xagg_fan_out_cpus)
		return verdict;
	__u32 cpu = (bpf_get_smp_processor_id() + 1) % xagg_fan_out_cpus;
	if (verdict == XDP_PASS)
		return bpf_redirect_map(&xagg_pass_cpus, cpu, verdict);
	return bpf_redirect_map(&xagg_result_cpus, cpu, verdict);
}

/* Runs on a fan-out CPU for each result handed to it. */
SEC("xdp.frags/cpumap")
int xagg_send_result(struct xdp_md *ctx)
{
	return bpf_redirect_map(&xagg_egress, 0, XDP_DROP);
}

/* The multicast MAC of an IPv4 group (RFC 1112): 01:00:5e and its low 23 bits. */
static __always_inline void multicast_mac(__be32 group, __u8 mac[ETH_ALEN])
{
	__u32 host = bpf_ntohl(group);

	mac[0] = 0x01;
	mac[1] = 0x00;
	mac[2] = 0x5e;
	mac[3] = (host >> 16) & 0x7f;
	mac[4] = (host >> 8) & 0xff;
	mac[5] = host & 0xff;
}

/* Remembers the source MAC of a worker's DATA, the next hop of its unicast
 * RESULTs; written only when it changed, so the entry stays shared in caches. */
static __always_inline void learn_next_hop(struct xagg_worker *worker, const __u8 mac[ETH_ALEN])
{
	int same = 1;

#pragma unroll
	for (int i = 0; i < ETH_ALEN; i++)
		same &= worker->next_hop_mac[i] == mac[i];
	if (!same)
		__builtin_memcpy(worker->next_hop_mac, mac, ETH_ALEN);
}

/* Sends the completed chunk (in pkt, made a RESULT) to the job's ranks. */
static __always_inline int deliver_result(struct xdp_md *ctx, struct xagg_packet *pkt, const struct xagg_job *job,
					  __u8 flags)
{
	static const __u8 broadcast_mac[ETH_ALEN] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
	__u8 group_mac[ETH_ALEN];

	switch (job->result_mode) {
	case XAGG_RESULTS_MULTICAST:
		multicast_mac(job->result_ip, group_mac);
		make_result(pkt, group_mac, job->result_ip, job->result_port, flags);
		return send_result(XDP_TX);
	case XAGG_RESULTS_UNICAST:
		/* Addresses are the tc program's, per rank. */
		make_result(pkt, broadcast_mac, job->result_ip, job->result_port, flags);
		return send_result(XDP_PASS);
	default:
		make_result(pkt, broadcast_mac, job->result_ip, job->result_port, flags);
		return send_result(XDP_TX);
	}
}

/* A completed reduce-scatter chunk: the values to its owner, the header
 * alone to every other rank. Copies differ, so the tc program makes them
 * (xagg_unicast.bpf.c), in any result mode; the rank field names the owner. */
static __always_inline int deliver_scattered(struct xdp_md *ctx, struct xagg_packet *pkt, const struct xagg_job *job,
					     const struct cell_result *result)
{
	static const __u8 broadcast_mac[ETH_ALEN] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

	make_result(pkt, broadcast_mac, job->result_ip, job->result_port, result->echo | XAGG_FLAG_SCATTER);
	pkt->hdr->rank = bpf_htons(result->owner);
	return send_result(XDP_PASS);
}

/* Turns the packet, whose payload now holds a leaf job's completed chunk,
 * into that leaf's DATA share for its parent and sends it to the next hop
 * towards the parent. CE on any share of the chunk goes up as CE, so that the
 * parent's echo reaches the ranks. */
static __always_inline int send_up(struct xagg_packet *pkt, const struct xagg_job *job, __u8 echo)
{
	const struct xagg_uplink *up = &job->uplink;

	__builtin_memcpy(pkt->eth->h_dest, up->next_hop_mac, ETH_ALEN);
	__builtin_memcpy(pkt->eth->h_source, up->local_mac, ETH_ALEN);

	pkt->ip->saddr = up->local_ip;
	pkt->ip->daddr = up->parent_ip;
	pkt->ip->ttl = 64;
	pkt->ip->tos = (pkt->ip->tos & ~XAGG_ECN_MASK) | (echo & XAGG_FLAG_CE ? XAGG_ECN_CE : XAGG_ECN_ECT0);
	xagg_ipv4_csum(pkt->ip);
	pkt->udp->source = bpf_htons(xagg_udp_port);
	pkt->udp->dest = up->parent_port;
	pkt->udp->check = 0;

	pkt->hdr->job_id = up->parent_job_id;
	pkt->hdr->token = bpf_cpu_to_be64(up->parent_token);
	pkt->hdr->rank = up->parent_rank;
	pkt->hdr->flags &= XAGG_FLAG_NARROW;
	count(job->slot, XAGG_CNT_SENT_UP);
	return XDP_TX;
}

/* Index of the one bit set in `bit` (de Bruijn). */
static const __u8 bit_index[64] = {
	0,  1,  48, 2,  57, 49, 28, 3,  61, 58, 50, 42, 38, 29, 17, 4,  62, 55, 59, 36, 53, 51,
	43, 22, 45, 39, 33, 30, 24, 18, 12, 5,  63, 47, 56, 27, 60, 41, 37, 16, 54, 35, 52, 21,
	44, 32, 23, 11, 46, 26, 40, 15, 34, 20, 31, 10, 25, 14, 19, 9,  13, 8,  7,  6};

/* The parent's answer to a leaf's repeated share (a rank asked again): to
 * that rank alone, as the RESEND of a one-level aggregator would be; to every
 * rank, in the job's mode, when several asked meanwhile. So a rank's loss
 * does not put the result on every other rank's link again. */
static __always_inline int relay_resend(struct xdp_md *ctx, struct xagg_packet *pkt, const struct xagg_job *job,
					__u32 job_id, __u8 echo)
{
	__u32 iteration = bpf_ntohl(pkt->hdr->iteration);
	__u32 capacity = 0;
	struct xagg_chunk *cell =
		lookup_cell(job->cell_class, job->slot, bpf_ntohl(pkt->hdr->chunk) * 2 + (iteration & 1), &capacity);
	__u64 asked = cell && cell->iteration == iteration ? __sync_lock_test_and_set(&cell->asked_again, 0) : 0;

	if (!asked || (asked & (asked - 1)))
		return deliver_result(ctx, pkt, job, echo);
	struct xagg_worker_key key = {.job_id = job_id,
				      .rank = bit_index[((asked & -asked) * 0x03f79d71b4cb0a89ULL) >> 58]};
	struct xagg_worker *worker = bpf_map_lookup_elem(&xagg_workers, &key);
	if (!worker)
		return deliver_result(ctx, pkt, job, echo);
	make_result(pkt, worker->next_hop_mac, worker->ip, worker->port, XAGG_FLAG_RESEND | echo);
	return XDP_TX;
}

/* A RESULT from a parent: the completed chunk of the leaf job that is a
 * member of the parent's job, passed on to that job's ranks as its own
 * RESULT. It carries the parent's token, which proves it came from the
 * parent; the rank field says no rank of this job completed it. */
static __always_inline int relay_down(struct xdp_md *ctx, struct xagg_packet *pkt)
{
	struct xagg_hdr *hdr = pkt->hdr;
	struct xagg_parent_key key = {.parent_ip = pkt->ip->saddr, .parent_job_id = bpf_ntohl(hdr->job_id)};
	__u32 *leaf_job_id = bpf_map_lookup_elem(&xagg_parents, &key);
	struct xagg_job *job = leaf_job_id ? bpf_map_lookup_elem(&xagg_jobs, leaf_job_id) : NULL;

	if (!job || !job->has_uplink) {
		count(XAGG_STATS_NO_JOB_ROW, XAGG_CNT_UNKNOWN_JOB);
		return XDP_DROP;
	}
	if (bpf_be64_to_cpu(hdr->token) != job->uplink.parent_token) {
		count(job->slot, XAGG_CNT_BAD_TOKEN);
		return XDP_DROP;
	}
	if (pkt->udp->source != job->uplink.parent_port) {
		count(job->slot, XAGG_CNT_WRONG_SOURCE);
		return XDP_DROP;
	}
	if (bpf_ntohl(hdr->chunk) >= job->num_chunks) {
		count(job->slot, XAGG_CNT_OUT_OF_RANGE);
		return XDP_DROP;
	}
	const __u8 flags = hdr->flags;
	hdr->job_id = bpf_htonl(*leaf_job_id);
	hdr->token = bpf_cpu_to_be64(job->token);
	hdr->rank = bpf_htons(XAGG_NO_RANK);
	/* As if sent to us, which a broadcast or multicast RESULT was not. */
	__builtin_memcpy(pkt->eth->h_dest, job->uplink.local_mac, ETH_ALEN);
	pkt->ip->daddr = job->uplink.local_ip;
	count(job->slot, XAGG_CNT_RELAYED_DOWN);
	if (flags & XAGG_FLAG_RESEND)
		return relay_resend(ctx, pkt, job, *leaf_job_id, flags & XAGG_FLAG_CE);
	return deliver_result(ctx, pkt, job, flags & XAGG_FLAG_CE);
}

SEC("xdp.frags")
int xagg_aggregate(struct xdp_md *ctx)
{
	struct xagg_packet pkt;

	switch (xagg_parse(ctx, xagg_udp_port, &pkt)) {
	case XAGG_PARSE_NOT_OURS:
		return XDP_PASS;
	case XAGG_PARSE_MALFORMED:
		count(XAGG_STATS_NO_JOB_ROW, XAGG_CNT_MALFORMED);
		return XDP_DROP;
	case XAGG_PARSE_OK:
		break;
	}

	struct xagg_hdr *hdr = pkt.hdr;
	const int from_parent = hdr->type == XAGG_MSG_RESULT;
	/* DATA flags: SCATTER, and OWNER only with it. */
	const int bad_data_flags = (hdr->flags & ~XAGG_DATA_FLAGS) ||
				   ((hdr->flags & XAGG_FLAG_OWNER) && !(hdr->flags & XAGG_FLAG_SCATTER));
	/* Int32 elements are whole pairs of lanes. */
	const __u32 narrow = (hdr->flags & XAGG_FLAG_NARROW) != 0;
	if (hdr->magic != bpf_htons(XAGG_MAGIC) || (hdr->type != XAGG_MSG_DATA && !from_parent) ||
	    (bad_data_flags && !from_parent) || hdr->op >= XAGG_OP_COUNT || (!narrow && pkt.payload_bytes % 4) ||
	    (!narrow && hdr->op == XAGG_OP_OR)) {
		count(XAGG_STATS_NO_JOB_ROW, XAGG_CNT_MALFORMED);
		return XDP_DROP;
	}
	if (hdr->version != XAGG_VERSION) {
		count(XAGG_STATS_NO_JOB_ROW, XAGG_CNT_BAD_VERSION);
		return XDP_DROP;
	}
	if (from_parent)
		return relay_down(ctx, &pkt);

	__u32 job_id = bpf_ntohl(hdr->job_id);
	struct xagg_job *job = bpf_map_lookup_elem(&xagg_jobs, &job_id);
	if (!job) {
		count(XAGG_STATS_NO_JOB_ROW, XAGG_CNT_UNKNOWN_JOB);
		return XDP_DROP;
	}
	__u32 row = job->slot;
	if (bpf_be64_to_cpu(hdr->token) != job->token) {
		count(row, XAGG_CNT_BAD_TOKEN);
		return XDP_DROP;
	}

	struct xagg_worker_key worker_key = {.job_id = job_id, .rank = bpf_ntohs(hdr->rank)};
	struct xagg_worker *worker = bpf_map_lookup_elem(&xagg_workers, &worker_key);
	if (!worker || worker_key.rank >= XAGG_MAX_WORKERS) {
		count(row, XAGG_CNT_UNKNOWN_WORKER);
		return XDP_DROP;
	}
	if (worker->ip != pkt.ip->saddr || worker->port != pkt.udp->source) {
		count(row, XAGG_CNT_WRONG_SOURCE);
		return XDP_DROP;
	}
	learn_next_hop(worker, pkt.eth->h_source);

	__u32 chunk = bpf_ntohl(hdr->chunk);
	if (chunk >= job->num_chunks) {
		count(row, XAGG_CNT_OUT_OF_RANGE);
		return XDP_DROP;
	}
	__u32 iteration = bpf_ntohl(hdr->iteration);
	__u32 capacity = 0;
	struct xagg_chunk *cell = lookup_cell(job->cell_class, row, chunk * 2 + (iteration & 1), &capacity);
	if (!cell) { /* the job is being torn down: its row goes with it */
		count(XAGG_STATS_NO_JOB_ROW, XAGG_CNT_UNKNOWN_JOB);
		return XDP_DROP;
	}
	/* Longer than the job's chunks: its cells have no room for it. Both
	 * bounds in bytes, on the lanes' own path, for the verifier. */
	if ((narrow && pkt.payload_bytes > capacity * 2) || pkt.payload_bytes > capacity * 4) {
		count(row, XAGG_CNT_LENGTH_MISMATCH);
		return XDP_DROP;
	}

	__u32 zero = 0;
	struct xagg_share *share = bpf_map_lookup_elem(&xagg_shares, &zero);
	if (!share) /* a per-CPU array's only entry: always there */
		return XDP_DROP;
	/* The only per-packet congestion work: remember CE on a share, echo it in the RESULT. */
	__u32 congested = (pkt.ip->tos & XAGG_ECN_MASK) == XAGG_ECN_CE;
	struct cell_result result = {};
	switch (merge_into_cell(ctx, pkt.payload_offset, pkt.payload_bytes, narrow, cell, capacity, share, iteration, hdr->op,
				bpf_ntohl(hdr->total), worker_key.rank, job, congested, hdr->flags, &result)) {
	case CELL_ADDED:
		count(row, XAGG_CNT_AGGREGATED);
		return XDP_DROP;
	case CELL_COMPLETED:
		count(row, XAGG_CNT_COMPLETED);
		/* A leaf's parent sees a plain chunk; the leaf relays its result in full. */
		if (job->has_uplink)
			return send_result(send_up(&pkt, job, result.echo));
		if (result.scatter)
			return deliver_scattered(ctx, &pkt, job, &result);
		return deliver_result(ctx, &pkt, job, result.echo);
	case CELL_RESEND: {
		__u8 sender_mac[ETH_ALEN];

		count(row, XAGG_CNT_RESENT);
		/* A leaf holds only its share: the parent answers with the result. */
		if (job->has_uplink)
			return send_result(send_up(&pkt, job, result.echo));
		/* A resend is rare: even a rank not owning a reduce-scatter chunk gets its values. */
		__builtin_memcpy(sender_mac, pkt.eth->h_source, ETH_ALEN);
		make_result(&pkt, sender_mac, pkt.ip->saddr, pkt.udp->source,
			    XAGG_FLAG_RESEND | result.echo | (result.scatter ? XAGG_FLAG_SCATTER : 0));
		if (result.scatter)
			pkt.hdr->rank = bpf_htons(result.owner);
		return XDP_TX;
	}
	case CELL_DUPLICATE:
		count(row, XAGG_CNT_DUPLICATE);
		return XDP_DROP;
	case CELL_STALE:
		count(row, XAGG_CNT_STALE);
		return XDP_DROP;
	case CELL_OP_MISMATCH:
		count(row, XAGG_CNT_OP_MISMATCH);
		return XDP_DROP;
	case CELL_LENGTH_MISMATCH:
		count(row, XAGG_CNT_LENGTH_MISMATCH);
		return XDP_DROP;
	case CELL_CONTENDED:
		count(row, XAGG_CNT_CONTENDED);
		return XDP_DROP;
	case CELL_PAYLOAD_ERROR:
		count(XAGG_STATS_NO_JOB_ROW, XAGG_CNT_MALFORMED);
		return XDP_DROP;
	}
	return XDP_DROP;
}

/* Run by the control plane with BPF_PROG_RUN when it creates a job, before
 * the job is registered: writes one word every page size through every cell
 * of the job's array, so that every page of the array gets written once. The
 * first touch of fresh map memory is slow (it faults into the hypervisor), and
 * paying it here spares the first packets, without copying the whole array in
 * from user space. */
#define TOUCH_STRIDE 4096
static long touch_cell(__u32 index, void *ctx)
{
	struct xagg_touch_request *request = ctx;
	__u32 capacity = 0;
	struct xagg_chunk *cell = lookup_cell(request->cell_class, request->slot, request->first + index, &capacity);

	if (!cell)
		return 1; /* past the end: stop */
	cell->busy = 0;
	/* Words TOUCH_STRIDE bytes apart from the cell's start to its end. */
	for (__u32 offset = TOUCH_STRIDE; offset < XAGG_CELL_BYTES(capacity); offset += TOUCH_STRIDE)
		cell->value[(offset - __builtin_offsetof(struct xagg_chunk, value)) / sizeof(__s32)] = 0;
	return 0;
}

SEC("xdp")
int xagg_touch_cells(struct xdp_md *ctx)
{
	struct xagg_touch_request *packet = (void *)(long)ctx->data;

	if ((void *)(packet + 1) > (void *)(long)ctx->data_end)
		return XDP_ABORTED;
	struct xagg_touch_request request = *packet;
	return bpf_loop(request.count, touch_cell, &request, 0) == request.count ? XDP_PASS : XDP_ABORTED;
}

char LICENSE[] SEC("license") = "GPL";
