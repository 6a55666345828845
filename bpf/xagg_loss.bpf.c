// SPDX-License-Identifier: GPL-2.0
/* Random packet loss for the testbed (there is no netem on these kernels):
 * a cls_bpf program on a link end that drops each frame with the
 * probability user space writes into drop_threshold. One loaded copy per
 * link end, so every link has its own rate and counters. A frame it keeps
 * goes on to the hook's next filter (the testbed's ingress shaping). */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

/* Drop when a uniform 32-bit random number is below this: rate * 2^32, so
 * 2^32 drops everything. Written at run time through the skeleton's bss. */
__u64 drop_threshold = 0;

/* Frames seen and dropped, for the measured loss rate (shared by all CPUs). */
__u64 frames_seen = 0;
__u64 frames_dropped = 0;

SEC("tc")
int xagg_loss(struct __sk_buff *skb)
{
	__sync_fetch_and_add(&frames_seen, 1);
	if ((__u64)bpf_get_prandom_u32() < drop_threshold) {
		__sync_fetch_and_add(&frames_dropped, 1);
		return TC_ACT_SHOT;
	}
	return TC_ACT_UNSPEC;
}

char LICENSE[] SEC("license") = "GPL";
