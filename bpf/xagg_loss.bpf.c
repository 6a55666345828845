// SPDX-License-Identifier: GPL-2.0
/* Placeholder until the testbed's loss-injection program lands. */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

SEC("tc")
int xagg_loss(struct __sk_buff *skb)
{
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
