/* Packet parsing for the XAgg data plane: Ethernet, IPv4, UDP, XAgg header. */
#ifndef XAGG_PARSE_H
#define XAGG_PARSE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>
#include "xagg_wire.h"

struct xagg_packet {
	struct ethhdr *eth;
	struct iphdr *ip;
	struct udphdr *udp;
	struct xagg_hdr *hdr;
	__u32 payload_offset; /* from the frame's start; read with bpf_xdp_load_bytes */
	__u32 payload_bytes;  /* 2 to XAGG_PAYLOAD_BYTES, even (int32 or, with XAGG_FLAG_NARROW, 16-bit lanes) */
};

enum xagg_parse_result {
	XAGG_PARSE_OK,
	XAGG_PARSE_NOT_OURS,  /* not IPv4/UDP to our port: leave it to the stack */
	XAGG_PARSE_MALFORMED, /* addressed to us but unusable */
};

/* Finds the headers of a packet sent to udp_port. A packet for our port must
 * be an unfragmented IPv4 packet without options whose UDP payload is one
 * XAgg header and 2 to XAGG_PAYLOAD_BYTES bytes of whole 16-bit lanes (the
 * header's flags tell whether they pair into int32 elements). The headers lie in the
 * frame's linear part; the payload may continue into fragments (xdp.frags). */
static __always_inline enum xagg_parse_result
xagg_parse(struct xdp_md *ctx, __u16 udp_port, struct xagg_packet *pkt)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	pkt->eth = data;
	if ((void *)(pkt->eth + 1) > data_end || pkt->eth->h_proto != bpf_htons(ETH_P_IP))
		return XAGG_PARSE_NOT_OURS;
	pkt->ip = (void *)(pkt->eth + 1);
	if ((void *)(pkt->ip + 1) > data_end || pkt->ip->version != 4 || pkt->ip->protocol != IPPROTO_UDP)
		return XAGG_PARSE_NOT_OURS;
	/* A later fragment has no UDP header: its bytes there are someone's data. */
	if (pkt->ip->frag_off & bpf_htons(0x1fff))
		return XAGG_PARSE_NOT_OURS;
	/* Options move the UDP header; find it to tell whether the packet is ours. */
	__u32 ip_bytes = pkt->ip->ihl * 4;
	if (ip_bytes < sizeof(struct iphdr))
		return XAGG_PARSE_NOT_OURS;
	struct udphdr *udp = (void *)pkt->ip + ip_bytes;
	if ((void *)(udp + 1) > data_end || udp->dest != bpf_htons(udp_port))
		return XAGG_PARSE_NOT_OURS;
	if (ip_bytes != sizeof(struct iphdr) || (pkt->ip->frag_off & bpf_htons(0x2000))) /* options or a first fragment */
		return XAGG_PARSE_MALFORMED;
	pkt->udp = (void *)(pkt->ip + 1);
	if ((void *)(pkt->udp + 1) > data_end)
		return XAGG_PARSE_MALFORMED;
	__u32 udp_bytes = bpf_ntohs(pkt->udp->len);
	if (bpf_ntohs(pkt->ip->tot_len) != sizeof(struct iphdr) + udp_bytes ||
	    udp_bytes < sizeof(struct udphdr) + XAGG_HDR_BYTES + 2 || udp_bytes > sizeof(struct udphdr) + XAGG_PACKET_BYTES)
		return XAGG_PARSE_MALFORMED;
	pkt->payload_bytes = udp_bytes - sizeof(struct udphdr) - XAGG_HDR_BYTES;
	if (pkt->payload_bytes % 2) /* whole lanes only */
		return XAGG_PARSE_MALFORMED;
	pkt->hdr = (void *)(pkt->udp + 1);
	if ((void *)(pkt->hdr + 1) > data_end)
		return XAGG_PARSE_MALFORMED;
	pkt->payload_offset = (void *)(pkt->hdr + 1) - data;
	if (bpf_xdp_get_buff_len(ctx) < pkt->payload_offset + pkt->payload_bytes)
		return XAGG_PARSE_MALFORMED;
	return XAGG_PARSE_OK;
}

/* RFC 1071 checksum of the 20-byte IPv4 header (no options). */
static __always_inline void xagg_ipv4_csum(struct iphdr *ip)
{
	__u16 *words = (__u16 *)ip;
	__u32 sum = 0;

	ip->check = 0;
#pragma unroll
	for (int i = 0; i < (int)(sizeof(*ip) / 2); i++)
		sum += words[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	ip->check = (__u16)~sum;
}

#endif
