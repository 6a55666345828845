// SPDX-License-Identifier: GPL-2.0
/* Placeholder until the switch-style (SwitchML) baseline lands. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp")
int xagg_switch(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
