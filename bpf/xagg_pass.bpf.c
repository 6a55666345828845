// SPDX-License-Identifier: GPL-2.0
/* Pass-through stub. veth delivers XDP_TX frames only when the peer device
 * also runs an XDP program, so the testbed attaches this one to the
 * aggregator's peer. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp.frags")
int xagg_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
