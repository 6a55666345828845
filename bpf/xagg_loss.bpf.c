// SPDX-License-Identifier: GPL-2.0
/* Random packet loss for the testbed (there is no netem on these kernels):
 * a cls_bpf program on a link end that loses each WIRE FRAME independently
 * with the probability user space writes into drop_threshold. One loaded copy
 * per link end, so every link has its own rate and counters. A frame it keeps
 * goes on to the hook's next filter (the testbed's ingress shaping).
 *
 * The testbed segments at every veth's transmit (testbed.h), so at the
 * switch-side hooks where the testbed places its loss an skb is one frame, as
 * on a wire. An skb that still carries several frames (GSO or GRO, gso_segs of
 * them: a filter placed on a host's own egress) cannot be split here; it is
 * dropped when any of its frames is lost, and counted as such (multi_frame_skbs),
 * so that the counters always say what happened in wire frames.
 * For tests that need one exact loss, it also drops the next targeted_drops
 * XAgg packets of one type and chunk. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "xagg_wire.h"

/* A 64 KB GSO skb at the smallest MTU (1280) carries 52 frames; more than
 * this many draws would only matter to BIG TCP, which the testbed does not use. */
#define MAX_DRAWS_PER_SKB 256

/* Lose a frame when a uniform 32-bit random number is below this: rate * 2^32,
 * so 2^32 loses every frame. Written at run time through the skeleton's bss. */
__u64 drop_threshold = 0;

/* Counters (shared by all CPUs), in wire frames except where named: */
__u64 frames_seen = 0;
__u64 frames_dropped = 0;
__u64 drop_events = 0;      /* skbs dropped: one loss event each */
__u64 multi_frame_skbs = 0; /* skbs of more than one frame seen */

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

/* Each frame is lost independently: true when any of `frames` is. */
static __always_inline int any_frame_lost(__u32 frames)
{
	for (__u32 i = 0; i < MAX_DRAWS_PER_SKB && i < frames; i++)
		if ((__u64)bpf_get_prandom_u32() < drop_threshold)
			return 1;
	return 0;
}

static __always_inline int drop(__u32 frames)
{
	__sync_fetch_and_add(&frames_dropped, frames);
	__sync_fetch_and_add(&drop_events, 1);
	return TC_ACT_SHOT;
}

SEC("tc")
int xagg_loss(struct __sk_buff *skb)
{
	__u32 frames = skb->gso_segs > 1 ? skb->gso_segs : 1;

	__sync_fetch_and_add(&frames_seen, frames);
	if (frames > 1)
		__sync_fetch_and_add(&multi_frame_skbs, 1);
	/* The fetch-and-add's old value decides, so that CPUs racing for the last drop take it once. */
	if (targeted_drops > 0 && is_target(skb) && __sync_fetch_and_add(&targeted_drops, -1) > 0)
		return drop(frames);
	if (any_frame_lost(frames))
		return drop(frames);
	return TC_ACT_UNSPEC;
}

char LICENSE[] SEC("license") = "GPL";
