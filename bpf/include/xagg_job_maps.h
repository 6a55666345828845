/* BPF maps that the XDP aggregator shares with the tc unicast fan-out
 * (xagg_unicast.bpf.c, which reuses the aggregator's maps): the jobs, their
 * workers and the outcome counters. */
#ifndef XAGG_JOB_MAPS_H
#define XAGG_JOB_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "xagg_structs.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, XAGG_MAX_JOBS);
	__type(key, __u32); /* job id */
	__type(value, struct xagg_job);
} xagg_jobs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, XAGG_MAX_JOBS * XAGG_MAX_WORKERS);
	__type(key, struct xagg_worker_key);
	__type(value, struct xagg_worker);
} xagg_workers SEC(".maps");

/* Outcome counters: row (job slot or XAGG_STATS_NO_JOB_ROW) * XAGG_CNT_COUNT + counter. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XAGG_STATS_ROWS * XAGG_CNT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} xagg_stats SEC(".maps");

static __always_inline void count(__u32 row, enum xagg_counter counter)
{
	__u32 key = row * XAGG_CNT_COUNT + counter;
	__u64 *slot = bpf_map_lookup_elem(&xagg_stats, &key);

	if (slot)
		*slot += 1; /* per-CPU: no other writer */
}

#endif
