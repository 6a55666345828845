// SPDX-License-Identifier: GPL-2.0
/* Feeder for `xagg bench capacity`. BPF_PROG_RUN with a repeat count runs the
 * program on one frame again and again, and the aggregator would count every
 * run after the first as a duplicate. This program turns each run into the
 * next share of an endless all-reduce (rank, chunk, iteration advance per CPU)
 * and tail-calls the aggregator, so every frame takes the add or the
 * completion path. A jumbo frame spans fragments, so both are xdp.frags
 * programs (a tail call needs that to match). */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "capacity_feed.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct feed_state);
} feed_states SEC(".maps");

/* The DATA frame's headers. A completion rewrites them in place into a RESULT,
 * and the next run gets the same buffer. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct feed_header);
} feed_template SEC(".maps");

/* Slot 0: the aggregator. Left empty, the feeder alone is measured. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} feed_target SEC(".maps");

static __always_inline void advance(__u32 *value, __u32 first, __u32 end, int *wrapped)
{
	if (++*value >= end) {
		*value = first;
		*wrapped = 1;
	}
}

SEC("xdp.frags")
int xcap_feed(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 zero = 0;

	struct feed_state *state = bpf_map_lookup_elem(&feed_states, &zero);
	struct feed_header *template = bpf_map_lookup_elem(&feed_template, &zero);
	if (!state || !template || data + FEED_HEADER_BYTES > data_end)
		return XDP_ABORTED;
	__builtin_memcpy(data, template->bytes, FEED_HEADER_BYTES);
	struct xagg_hdr *hdr = data + FEED_HEADER_BYTES - XAGG_HDR_BYTES;
	hdr->rank = bpf_htons(state->rank);
	hdr->chunk = bpf_htonl(state->chunk);
	hdr->iteration = bpf_htonl(state->iteration);

	int wrapped = 0;
	if (state->ranks_first) {
		advance(&state->rank, 0, state->world_size, &wrapped);
		if (wrapped) {
			wrapped = 0;
			advance(&state->chunk, state->first_chunk, state->end_chunk, &wrapped);
		}
	} else {
		advance(&state->chunk, state->first_chunk, state->end_chunk, &wrapped);
		if (wrapped) {
			wrapped = 0;
			advance(&state->rank, 0, state->world_size, &wrapped);
		}
	}
	if (wrapped)
		state->iteration++;

	bpf_tail_call(ctx, &feed_target, 0);
	return XDP_DROP;
}

char LICENSE[] SEC("license") = "GPL";
