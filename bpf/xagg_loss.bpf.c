// SPDX-License-Identifier: GPL-2.0
/* Random packet loss for the testbed (there is no netem on these kernels):
 * a cls_bpf program on a link end that drops each frame with the
 * probability user space writes into drop_threshold. One loaded copy per
 * link end, so every link has its own rate and counters. A frame it keeps
 * goes on to the hook's next filter (the testbed's ingress shaping).
 * For tests that need one exact loss, it also drops the next
 * targeted_drops XAgg packets of one type and chunk. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "xagg_wire.h"

/* Drop when a uniform 32-bit random number is below this: rate * 2^32, so
 * 2^32 drops everything. Written at run time through the skeleton's bss. */
__u64 drop_threshold = 0;

/* Frames seen and dropped, for the measured loss rate (shared by all CPUs). */
__u64 frames_seen = 0;
__u64 frames_dropped = 0;

/* The targeted drop: packets of this enum xagg_msg_type whose (aggregator-
 * local) chunk field is target_chunk; while targeted_drops > 0. */
__u32 target_type = 0;
__u32 target_chunk = 0;
__s64 targeted_drops = 0;

static __always_inline int is_target(struct __sk_buff *skb)
{
	struct ethhdr eth;
	struct iphdr ip;
	struct xagg_hdr hdr;
	__u32 l4;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) || eth.h_proto != bpf_htons(ETH_P_IP) ||
	    bpf_skb_load_bytes(skb, sizeof(eth), &ip, sizeof(ip)) || ip.protocol != IPPROTO_UDP)
		return 0;
	l4 = sizeof(eth) + ip.ihl * 4;
	if (bpf_skb_load_bytes(skb, l4 + sizeof(struct udphdr), &hdr, sizeof(hdr)))
		return 0;
	return hdr.magic == bpf_htons(XAGG_MAGIC) && hdr.type == target_type &&
	       hdr.chunk == bpf_htonl(target_chunk);
}

SEC("tc")
int xagg_loss(struct __sk_buff *skb)
{
	__sync_fetch_and_add(&frames_seen, 1);
	/* The fetch-and-add's old value decides, so that CPUs racing for the last drop take it once. */
	if (targeted_drops > 0 && is_target(skb) && __sync_fetch_and_add(&targeted_drops, -1) > 0) {
		__sync_fetch_and_add(&frames_dropped, 1);
		return TC_ACT_SHOT;
	}
	if ((__u64)bpf_get_prandom_u32() < drop_threshold) {
		__sync_fetch_and_add(&frames_dropped, 1);
		return TC_ACT_SHOT;
	}
	return TC_ACT_UNSPEC;
}

char LICENSE[] SEC("license") = "GPL";
