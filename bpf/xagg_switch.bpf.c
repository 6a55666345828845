// SPDX-License-Identifier: GPL-2.0
/* Switch-style baseline: SwitchML's slot-pool aggregation (NSDI'21,
 * Algorithm 3 with shadow copies) on the same XDP substrate as XAgg. The job
 * has a pool of `slots` slots, each with two copies (ver 0/1); a worker sends
 * its next block into a slot only after that slot's previous result came back,
 * so every slot advances in lock-step with the slowest worker. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "xagg_parse.h" /* xagg_ipv4_csum */
#include "xagg_switch_wire.h"

/* Set by the loader before the program is loaded. */
const volatile __u16 xsw_udp_port = 9989;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xsw_config);
} xsw_config_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, XSW_MAX_WORKERS);
	__type(key, __u32);
	__type(value, struct xsw_worker);
} xsw_workers SEC(".maps");

/* Two copies per slot: index slot * 2 + ver. The loader sizes it to the pool. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * XSW_DEFAULT_SLOTS);
	__type(key, __u32);
	__type(value, struct xsw_slot);
} xsw_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xsw_share);
} xsw_shares SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XSW_CNT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} xsw_counters SEC(".maps");

static __always_inline void count(__u32 counter)
{
	__u64 *value = bpf_map_lookup_elem(&xsw_counters, &counter);

	if (value)
		*value += 1;
}

enum slot_outcome {
	SLOT_ADDED,
	SLOT_COMPLETED,
	SLOT_RESEND,
	SLOT_IGNORED,
	SLOT_CONTENDED,
	SLOT_LENGTH_MISMATCH,
	SLOT_PAYLOAD_ERROR, /* the packet's payload could not be read or written */
};

#define SLOT_LOCK_ATTEMPTS (1 << 16)

/* Shares are added by a loop over blocks of this many elements, each block
 * unrolled, as in xagg_aggregator.bpf.c: a 2048-element packet unrolled whole
 * would make a program of tens of thousands of instructions. The last block
 * of a share shorter than a whole number of blocks adds elements past its
 * end, which nothing reads. */
#define MERGE_BLOCK_ELEMS 64
#define MERGE_BLOCKS (XSW_MAX_PACKET_ELEMS / MERGE_BLOCK_ELEMS)

struct lock_attempt {
	struct xsw_slot *slot;
	int locked;
};

static long try_lock_slot(__u32 attempt, void *ctx)
{
	struct lock_attempt *lock = ctx;

	lock->locked = __sync_val_compare_and_swap(&lock->slot->busy, 0, 1) == 0;
	return lock->locked;
}

/* SwitchML's per-packet logic. `other` is the slot's other copy: a share of
 * version v proves the sender consumed the result of version 1-v, so its
 * seen bit there is cleared (that copy may then be overwritten). The payload
 * at payload_offset may span fragments, so it is copied: a use's first share
 * straight into the slot, a later one into the per-CPU `share` to be added
 * from there. A completed (or re-requested) slot's value is written back over
 * it before the lock is released. */
static __always_inline enum slot_outcome
merge_into_slot(struct xdp_md *ctx, __u32 payload_offset, __u32 payload_bytes, struct xsw_slot *slot,
		struct xsw_slot *other, __s32 *share, __u32 op, __u64 rank_bit, __u32 world_size)
{
	struct lock_attempt lock = {.slot = slot, .locked = 0};
	const __u32 elems = payload_bytes / 4;
	enum slot_outcome outcome;

	bpf_loop(SLOT_LOCK_ATTEMPTS, try_lock_slot, &lock, 0);
	if (!lock.locked)
		return SLOT_CONTENDED;
	if (slot->seen & rank_bit) {
		outcome = slot->count != 0 ? SLOT_IGNORED : elems == slot->elems ? SLOT_RESEND : SLOT_LENGTH_MISMATCH;
	} else if (slot->count == 0) {
		/* The helper checks the range before copying: a failure leaves the slot as it was. */
		if (bpf_xdp_load_bytes(ctx, payload_offset, slot->value, payload_bytes)) {
			outcome = SLOT_PAYLOAD_ERROR;
		} else {
			slot->op = op;
			slot->elems = elems;
			outcome = SLOT_ADDED;
		}
	} else if (elems != slot->elems) {
		outcome = SLOT_LENGTH_MISMATCH;
	} else if (bpf_xdp_load_bytes(ctx, payload_offset, share, payload_bytes)) {
		outcome = SLOT_PAYLOAD_ERROR;
	} else {
		if (op == XSW_OP_SUM) {
#pragma clang loop unroll(disable)
			for (int block = 0; block < MERGE_BLOCKS && block * MERGE_BLOCK_ELEMS < elems; block++) {
#pragma clang loop unroll(full)
				for (int i = block * MERGE_BLOCK_ELEMS; i < (block + 1) * MERGE_BLOCK_ELEMS; i++)
					slot->value[i] += share[i];
			}
		} else {
#pragma clang loop unroll(disable)
			for (int block = 0; block < MERGE_BLOCKS && block * MERGE_BLOCK_ELEMS < elems; block++) {
#pragma clang loop unroll(full)
				for (int i = block * MERGE_BLOCK_ELEMS; i < (block + 1) * MERGE_BLOCK_ELEMS; i++)
					if (share[i] > slot->value[i])
						slot->value[i] = share[i];
			}
		}
		outcome = SLOT_ADDED;
	}
	if (outcome == SLOT_ADDED) {
		/* Atomic: the other copy's lock holder may be setting its own bit. */
		__sync_fetch_and_or(&slot->seen, rank_bit);
		__sync_fetch_and_and(&other->seen, ~rank_bit);
		slot->count = slot->count + 1 == world_size ? 0 : slot->count + 1;
		if (slot->count == 0)
			outcome = SLOT_COMPLETED;
	}
	if ((outcome == SLOT_COMPLETED || outcome == SLOT_RESEND) &&
	    bpf_xdp_store_bytes(ctx, payload_offset, slot->value, payload_bytes))
		outcome = SLOT_PAYLOAD_ERROR;
	__sync_lock_test_and_set(&slot->busy, 0);
	return outcome;
}

SEC("xdp.frags")
int xagg_switch(struct xdp_md *ctx)
{
	static const __u8 broadcast_mac[ETH_ALEN] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *udp = (void *)(ip + 1);
	struct xsw_hdr *hdr = (void *)(udp + 1);

	/* A later fragment has no UDP header: its bytes there are someone's data. */
	if ((void *)(udp + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->version != 4 ||
	    ip->protocol != IPPROTO_UDP || ip->ihl != 5 || (ip->frag_off & bpf_htons(0x1fff)) ||
	    udp->dest != bpf_htons(xsw_udp_port))
		return XDP_PASS;
	/* The headers lie in the frame's linear part; the payload may continue into fragments. */
	__u32 udp_bytes = bpf_ntohs(udp->len);
	__u32 payload_bytes = udp_bytes - sizeof(*udp) - XSW_HDR_BYTES;
	__u32 payload_offset = (void *)(hdr + 1) - data;
	if ((void *)(hdr + 1) > data_end || (ip->frag_off & bpf_htons(0x2000)) ||
	    bpf_ntohs(ip->tot_len) != sizeof(*ip) + udp_bytes || payload_bytes < 4 ||
	    payload_bytes > XSW_MAX_PAYLOAD_BYTES || payload_bytes % 4 ||
	    bpf_xdp_get_buff_len(ctx) < payload_offset + payload_bytes || hdr->magic != bpf_htons(XSW_MAGIC) ||
	    hdr->type != XSW_MSG_DATA || hdr->op > XSW_OP_MAX) {
		count(XSW_CNT_REJECTED);
		return XDP_DROP;
	}

	__u32 zero = 0;
	struct xsw_config *config = bpf_map_lookup_elem(&xsw_config_map, &zero);
	__u32 rank = bpf_ntohs(hdr->rank);
	struct xsw_worker *worker = bpf_map_lookup_elem(&xsw_workers, &rank);
	__u32 slot_index = bpf_ntohs(hdr->slot);
	if (!config || !config->active || bpf_ntohl(hdr->job_id) != config->job_id ||
	    bpf_be64_to_cpu(hdr->token) != config->token || !worker || !worker->registered ||
	    worker->ip != ip->saddr || worker->port != udp->source || slot_index >= config->slots) {
		count(XSW_CNT_REJECTED);
		return XDP_DROP;
	}
	__u32 copy = slot_index * 2 + (hdr->ver & 1);
	__u32 other_copy = copy ^ 1;
	struct xsw_slot *slot = bpf_map_lookup_elem(&xsw_slots, &copy);
	struct xsw_slot *other = bpf_map_lookup_elem(&xsw_slots, &other_copy);
	if (!slot || !other) {
		count(XSW_CNT_REJECTED);
		return XDP_DROP;
	}

	struct xsw_share *share = bpf_map_lookup_elem(&xsw_shares, &zero);
	if (!share) /* a per-CPU array's only entry: always there */
		return XDP_DROP;

	enum slot_outcome outcome = merge_into_slot(ctx, payload_offset, payload_bytes, slot, other, share->value,
						    hdr->op, 1ULL << (rank & 63), config->world_size);
	switch (outcome) {
	case SLOT_ADDED:
		count(XSW_CNT_AGGREGATED);
		return XDP_DROP;
	case SLOT_IGNORED:
		count(XSW_CNT_IGNORED);
		return XDP_DROP;
	case SLOT_CONTENDED:
		count(XSW_CNT_CONTENDED);
		return XDP_DROP;
	case SLOT_LENGTH_MISMATCH:
		count(XSW_CNT_LENGTH_MISMATCH);
		return XDP_DROP;
	case SLOT_PAYLOAD_ERROR:
		count(XSW_CNT_REJECTED);
		return XDP_DROP;
	case SLOT_COMPLETED:
	case SLOT_RESEND:
		break;
	}

	/* The DATA packet becomes the RESULT: broadcast, or back to its sender. */
	__u8 our_mac[ETH_ALEN];
	__u8 sender_mac[ETH_ALEN];
	__builtin_memcpy(our_mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(sender_mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, our_mac, ETH_ALEN);
	ip->ttl = 64;
	__be32 sender_ip = ip->saddr;
	ip->saddr = ip->daddr;
	udp->check = 0; /* veth leaves a partial checksum; 0 is valid for IPv4 */
	__be16 sender_port = udp->source;
	udp->source = udp->dest;
	hdr->type = XSW_MSG_RESULT;
	if (outcome == SLOT_COMPLETED) {
		count(XSW_CNT_COMPLETED);
		__builtin_memcpy(eth->h_dest, broadcast_mac, ETH_ALEN);
		ip->daddr = config->bcast_ip;
		udp->dest = config->result_port;
		hdr->flags = 0;
	} else {
		count(XSW_CNT_RESENT);
		__builtin_memcpy(eth->h_dest, sender_mac, ETH_ALEN);
		ip->daddr = sender_ip;
		udp->dest = sender_port;
		hdr->flags = XSW_FLAG_RESEND;
	}
	xagg_ipv4_csum(ip);
	return XDP_TX;
}

char LICENSE[] SEC("license") = "GPL";
