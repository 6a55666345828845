// SPDX-License-Identifier: GPL-2.0
/* XAgg unicast result fan-out: a tc (clsact ingress) program on the
 * aggregator's interface. XDP cannot copy a packet, so for a job whose results
 * go by unicast (routed networks without multicast) the XDP aggregator passes
 * the completed RESULT to the stack; this program sends one clone of it to
 * every rank of the job, each addressed to the
 * rank (its IP and port, and the MAC of its next hop as learned from its
 * DATA), and drops the original. A completed reduce-scatter chunk (RESULT
 * flag SCATTER, in any result mode) goes whole to its owner (the rank field)
 * and as its header alone to every other rank. It acts only on a RESULT that
 * carries its job's token, to the job's result port, as XDP made it (a packet
 * from the wire must hold the job's secret to be copied); everything else
 * passes untouched. It shares the aggregator's job, worker and counter maps
 * (the loader reuses them). */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "xagg_job_maps.h"

#define IP_OFFSET ETH_HLEN
#define UDP_OFFSET (IP_OFFSET + sizeof(struct iphdr)) /* XDP made the header: no options */
#define HDR_OFFSET (UDP_OFFSET + sizeof(struct udphdr))
#define HEADERS_BYTES (HDR_OFFSET + XAGG_HDR_BYTES)

/* Cuts the RESULT down to its headers: the IPv4 and UDP lengths follow (the
 * UDP checksum is 0, none). */
static __always_inline int trim_to_header(struct __sk_buff *skb)
{
	const __be16 ip_length = bpf_htons(HEADERS_BYTES - IP_OFFSET);
	const __be16 udp_length = bpf_htons(HEADERS_BYTES - UDP_OFFSET);
	__be16 old_ip_length;

	if (bpf_skb_load_bytes(skb, IP_OFFSET + __builtin_offsetof(struct iphdr, tot_len), &old_ip_length,
			       sizeof(old_ip_length)) ||
	    bpf_skb_change_tail(skb, HEADERS_BYTES, 0) ||
	    bpf_l3_csum_replace(skb, IP_OFFSET + __builtin_offsetof(struct iphdr, check), old_ip_length, ip_length,
				sizeof(ip_length)) ||
	    bpf_skb_store_bytes(skb, IP_OFFSET + __builtin_offsetof(struct iphdr, tot_len), &ip_length,
				sizeof(ip_length), 0) ||
	    bpf_skb_store_bytes(skb, UDP_OFFSET + __builtin_offsetof(struct udphdr, len), &udp_length,
				sizeof(udp_length), 0))
		return -1;
	return 0;
}

SEC("tc")
int xagg_unicast_results(struct __sk_buff *skb)
{
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
	struct xagg_hdr hdr;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) || eth.h_proto != bpf_htons(ETH_P_IP) ||
	    bpf_skb_load_bytes(skb, IP_OFFSET, &ip, sizeof(ip)) || ip.ihl != 5 || ip.protocol != IPPROTO_UDP ||
	    bpf_skb_load_bytes(skb, UDP_OFFSET, &udp, sizeof(udp)) ||
	    bpf_skb_load_bytes(skb, HDR_OFFSET, &hdr, sizeof(hdr)) || hdr.magic != bpf_htons(XAGG_MAGIC) ||
	    hdr.type != XAGG_MSG_RESULT)
		return TC_ACT_OK;
	__u32 job_id = bpf_ntohl(hdr.job_id);
	struct xagg_job *job = bpf_map_lookup_elem(&xagg_jobs, &job_id);
	const int scattered = (hdr.flags & XAGG_FLAG_SCATTER) != 0;
	if (!job || bpf_be64_to_cpu(hdr.token) != job->token || udp.dest != job->result_port ||
	    (job->result_mode != XAGG_RESULTS_UNICAST && !scattered))
		return TC_ACT_OK;
	/* From here on the packet is a RESULT of the job, never a copy for the stack. */
	__u32 row = job->slot;
	__u32 world_size = job->world_size;
	/* A reduce-scatter chunk: the owner's copy first, whole; then the headers. */
	__u32 first = 0;
	int whole = 1;
	if (scattered) {
		first = bpf_ntohs(hdr.rank);
		if (first >= world_size) { /* no owner: headers only */
			first = 0;
			if (trim_to_header(skb))
				return TC_ACT_SHOT;
			whole = 0;
		}
	}
	__be32 current_ip;
	if (bpf_skb_load_bytes(skb, IP_OFFSET + __builtin_offsetof(struct iphdr, daddr), &current_ip, sizeof(current_ip)))
		return TC_ACT_SHOT;

	for (__u32 index = 0; index < XAGG_MAX_WORKERS && index < world_size; index++) {
		__u32 rank = first + index < world_size ? first + index : first + index - world_size;
		if (scattered && whole && index == 1) {
			if (trim_to_header(skb))
				return TC_ACT_SHOT;
			whole = 0;
		}
		struct xagg_worker_key key = {.job_id = job_id, .rank = rank};
		struct xagg_worker *worker = bpf_map_lookup_elem(&xagg_workers, &key);
		if (!worker)
			continue;
		__be32 ip = worker->ip;
		__be16 port = worker->port;
		__u8 mac[ETH_ALEN];
		__builtin_memcpy(mac, worker->next_hop_mac, ETH_ALEN);
		/* The UDP checksum is 0 (none): only the IPv4 header checksum follows the address. */
		if (bpf_skb_store_bytes(skb, 0, mac, ETH_ALEN, 0) ||
		    bpf_l3_csum_replace(skb, IP_OFFSET + __builtin_offsetof(struct iphdr, check), current_ip, ip,
					sizeof(ip)) ||
		    bpf_skb_store_bytes(skb, IP_OFFSET + __builtin_offsetof(struct iphdr, daddr), &ip, sizeof(ip), 0) ||
		    bpf_skb_store_bytes(skb, UDP_OFFSET + __builtin_offsetof(struct udphdr, dest), &port, sizeof(port),
					0))
			return TC_ACT_SHOT;
		current_ip = ip;
		if (bpf_clone_redirect(skb, skb->ifindex, 0) == 0)
			count(row, whole ? XAGG_CNT_UNICAST_COPIES : XAGG_CNT_SCATTER_HEADERS);
	}
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "GPL";
