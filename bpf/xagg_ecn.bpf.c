// SPDX-License-Identifier: GPL-2.0
/* ECN marking for the testbed's shaped links (this kernel has no RED, CoDel or
 * PIE): a cls_bpf program on the egress of the device whose tbf shapes one
 * direction of a link. It keeps a phantom queue (HULL, NSDI'12): a counter of
 * the bytes that arrived minus what a link at drain_bytes_per_s would have
 * sent since, never below 0 nor above tbf's queue limit. Egress filters run
 * before the qdisc's enqueue, so at the shaped rate the phantom queue follows
 * tbf's backlog; at a fraction of it, it marks before a real queue builds. While it holds more
 * than threshold_bytes, ECT(0) and ECT(1) IPv4 packets get CE (checksum
 * updated); Not-ECT packets are never changed, and no packet is dropped.
 * One loaded copy per link direction: its own rate, threshold and counters. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#ifndef offsetof
#define offsetof(type, member) __builtin_offsetof(type, member)
#endif

#define ECN_MASK 3
#define ECN_CE 3
#define NSEC_PER_SEC 1000000000ULL

/* Written by user space before attaching (the skeleton's bss). */
__u64 drain_bytes_per_s = 0;
__u64 threshold_bytes = 0;
/* tbf's queue limit: a packet that would not fit is dropped by tbf and never
 * takes its turn on the link, so it does not join the phantom queue either. */
__u64 limit_bytes = 0;

/* Counters read by user space (shared by all CPUs), in wire frames: a GSO
 * packet's frames share its IP header, so a mark reaches all of them. Marking
 * decides per packet; the packets it can mark here are XAgg's datagrams, one
 * frame each (the testbed's TCP does not negotiate ECN). */
__u64 frames_seen = 0;
__u64 ect_frames = 0;  /* of ECT(0)/ECT(1) IPv4 packets: the ones that could be marked */
__u64 frames_marked = 0;
__u64 max_queue_bytes = 0; /* the phantom queue's high-water mark */

struct phantom_queue {
	struct bpf_spin_lock lock; /* several CPUs transmit on one device */
	__u64 bytes;
	__u64 updated_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct phantom_queue);
} queue SEC(".maps");

/* Adds the packet to the phantom queue and returns its length after. */
static __always_inline __u64 enqueue(__u32 len)
{
	__u32 key = 0;
	struct phantom_queue *q = bpf_map_lookup_elem(&queue, &key);
	if (!q)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	bpf_spin_lock(&q->lock);
	__u64 elapsed = now - q->updated_ns;
	/* Past a second idle any queue has drained; also keeps the product below 2^64. */
	__u64 drained = elapsed >= NSEC_PER_SEC ? ~0ULL : elapsed * drain_bytes_per_s / NSEC_PER_SEC;
	__u64 bytes = q->bytes > drained ? q->bytes - drained : 0;
	if (bytes + len <= limit_bytes)
		bytes += len;
	q->bytes = bytes;
	q->updated_ns = now;
	bpf_spin_unlock(&q->lock);
	return bytes;
}

SEC("tc")
int xagg_ecn(struct __sk_buff *skb)
{
	__u32 frames = skb->gso_segs > 1 ? skb->gso_segs : 1;

	__sync_fetch_and_add(&frames_seen, frames);
	/* A GSO packet counts with all its bytes, as tbf charges it. */
	__u64 backlog = enqueue(skb->len);
	if (backlog > max_queue_bytes)
		max_queue_bytes = backlog; /* a racy maximum is good enough for a report */

	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return TC_ACT_UNSPEC;
	__u8 ecn = ip->tos & ECN_MASK;
	if (ecn == 0 || ecn == ECN_CE)
		return TC_ACT_UNSPEC;
	__sync_fetch_and_add(&ect_frames, frames);
	if (backlog <= threshold_bytes)
		return TC_ACT_UNSPEC;

	/* tos shares its 16-bit checksum word with version and ihl. */
	const __u32 word_offset = sizeof(*eth);
	__u16 old_word = *(__u16 *)ip;
	__u8 tos = ip->tos | ECN_CE;
	__u16 new_word = old_word;
	((__u8 *)&new_word)[1] = tos;
	if (bpf_l3_csum_replace(skb, word_offset + offsetof(struct iphdr, check), old_word, new_word, 2) < 0)
		return TC_ACT_UNSPEC;
	if (bpf_skb_store_bytes(skb, word_offset + offsetof(struct iphdr, tos), &tos, 1, 0) < 0)
		return TC_ACT_UNSPEC;
	__sync_fetch_and_add(&frames_marked, frames);
	return TC_ACT_UNSPEC;
}

char LICENSE[] SEC("license") = "GPL";
