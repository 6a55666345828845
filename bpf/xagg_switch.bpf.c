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

enum slot_outcome { SLOT_ADDED, SLOT_COMPLETED, SLOT_RESEND, SLOT_IGNORED, SLOT_CONTENDED };

#define SLOT_LOCK_ATTEMPTS (1 << 16)

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
 * seen bit there is cleared (that copy may then be overwritten). */
static __always_inline enum slot_outcome
merge_into_slot(struct xsw_slot *slot, struct xsw_slot *other, __s32 *payload, __u32 op,
		__u64 rank_bit, __u32 world_size)
{
	struct lock_attempt lock = {.slot = slot, .locked = 0};
	enum slot_outcome outcome;

	bpf_loop(SLOT_LOCK_ATTEMPTS, try_lock_slot, &lock, 0);
	if (!lock.locked)
		return SLOT_CONTENDED;
	if (!(slot->seen & rank_bit)) {
		/* Atomic: the other copy's lock holder may be setting its own bit. */
		__sync_fetch_and_or(&slot->seen, rank_bit);
		__sync_fetch_and_and(&other->seen, ~rank_bit);
		if (slot->count == 0) {
#pragma clang loop unroll(full)
			for (int i = 0; i < XSW_PACKET_ELEMS; i++)
				slot->value[i] = payload[i];
			slot->op = op;
		} else if (op == XSW_OP_SUM) {
#pragma clang loop unroll(full)
			for (int i = 0; i < XSW_PACKET_ELEMS; i++)
				slot->value[i] += payload[i];
		} else {
#pragma clang loop unroll(full)
			for (int i = 0; i < XSW_PACKET_ELEMS; i++)
				if (payload[i] > slot->value[i])
					slot->value[i] = payload[i];
		}
		slot->count = slot->count + 1 == world_size ? 0 : slot->count + 1;
		outcome = slot->count == 0 ? SLOT_COMPLETED : SLOT_ADDED;
	} else {
		outcome = slot->count == 0 ? SLOT_RESEND : SLOT_IGNORED;
	}
	if (outcome == SLOT_COMPLETED || outcome == SLOT_RESEND) {
#pragma clang loop unroll(full)
		for (int i = 0; i < XSW_PACKET_ELEMS; i++)
			payload[i] = slot->value[i];
	}
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
	__s32 *payload = (void *)(hdr + 1);

	/* A later fragment has no UDP header: its bytes there are someone's data. */
	if ((void *)(udp + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->version != 4 ||
	    ip->protocol != IPPROTO_UDP || ip->ihl != 5 || (ip->frag_off & bpf_htons(0x1fff)) ||
	    udp->dest != bpf_htons(xsw_udp_port))
		return XDP_PASS;
	if ((void *)payload + XSW_PAYLOAD_BYTES > data_end || (ip->frag_off & bpf_htons(0x2000)) ||
	    bpf_ntohs(udp->len) != sizeof(*udp) + XSW_PACKET_BYTES || hdr->magic != bpf_htons(XSW_MAGIC) ||
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

	enum slot_outcome outcome =
		merge_into_slot(slot, other, payload, hdr->op, 1ULL << (rank & 63), config->world_size);
	if (outcome == SLOT_ADDED || outcome == SLOT_IGNORED || outcome == SLOT_CONTENDED) {
		count(outcome == SLOT_ADDED ? XSW_CNT_AGGREGATED
		      : outcome == SLOT_IGNORED ? XSW_CNT_IGNORED : XSW_CNT_CONTENDED);
		return XDP_DROP;
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
