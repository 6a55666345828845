// SPDX-License-Identifier: GPL-2.0
/* Testbed only: the routed layout's static multicast route. On the router's
 * subnet-A leg (tc clsact ingress) it forwards every IPv4 packet sent to the
 * testbed's groups out of the subnet-B leg, as a multicast router with the
 * static route "from A, groups G/len, to B" does: TTL decremented, source MAC
 * the outgoing leg's. The kernel's own multicast routing (smcroute and the like)
 * is not built into the machines XAgg is tested on (no CONFIG_IP_MROUTE). */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* Set by the loader before the program is loaded. */
const volatile __be32 xagg_group_prefix = 0; /* network order */
const volatile __be32 xagg_group_mask = 0;   /* network order */
const volatile __u32 xagg_out_ifindex = 0;
const volatile __u8 xagg_out_mac[ETH_ALEN] = {};

SEC("tc")
int xagg_forward_multicast(struct __sk_buff *skb)
{
	if (bpf_skb_pull_data(skb, ETH_HLEN + sizeof(struct iphdr)))
		return TC_ACT_OK;
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);

	if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP) ||
	    (ip->daddr & xagg_group_mask) != xagg_group_prefix || ip->ttl <= 1)
		return TC_ACT_OK;
	/* TTL shares a 16-bit checksum word with the protocol field. */
	__be16 old_word = *(__be16 *)&ip->ttl;
	ip->ttl--;
	__be16 new_word = *(__be16 *)&ip->ttl;
	/* Byte by byte: a memcpy would drop the volatile, and clang would copy the zeros it was compiled with. */
#pragma unroll
	for (int i = 0; i < ETH_ALEN; i++)
		eth->h_source[i] = xagg_out_mac[i];
	if (bpf_l3_csum_replace(skb, ETH_HLEN + __builtin_offsetof(struct iphdr, check), old_word, new_word,
				sizeof(new_word)))
		return TC_ACT_OK;
	bpf_clone_redirect(skb, xagg_out_ifindex, 0);
	return TC_ACT_OK; /* the router's own stack sees it too, as on a real router */
}

char LICENSE[] SEC("license") = "GPL";
