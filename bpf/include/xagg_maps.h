/* BPF maps of the XAgg data plane. The control plane (src/dataplane) fills
 * jobs, workers and the per-job chunk arrays; XDP reads the first two and
 * writes only a worker's next-hop MAC. */
#ifndef XAGG_MAPS_H
#define XAGG_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "xagg_job_maps.h"


/* The whole gradient of each job: slot -> array of 2 * num_chunks cells, in
 * the map of maps of the job's cell class (xagg_structs.h), one per class
 * because an inner array must have its template's value size. Inner arrays
 * are created per job with their own length (BPF_F_INNER_MAP). Sizes rather
 * than BTF types: clang 14 emits the value struct of an inner map definition
 * only as a forward declaration. */
#define XAGG_CELL_MAP(class_name, elems)                                   \
	struct xagg_cell_array_##class_name {                              \
		__uint(type, BPF_MAP_TYPE_ARRAY);                           \
		__uint(map_flags, BPF_F_INNER_MAP);                         \
		__uint(max_entries, 1);                                     \
		__uint(key_size, sizeof(__u32));                            \
		__uint(value_size, XAGG_CELL_BYTES(elems));                 \
	};                                                                  \
	struct {                                                            \
		__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);                   \
		__uint(max_entries, XAGG_MAX_JOBS);                         \
		__type(key, __u32);                                         \
		__array(values, struct xagg_cell_array_##class_name);       \
	} xagg_cells_##class_name SEC(".maps")

XAGG_CELL_MAP(small, XAGG_CELL_ELEMS_SMALL);
XAGG_CELL_MAP(medium, XAGG_CELL_ELEMS_MEDIUM);
XAGG_CELL_MAP(large, XAGG_CELL_ELEMS_LARGE);
XAGG_CELL_MAP(narrow_jumbo, XAGG_CELL_ELEMS_NARROW_JUMBO);

/* The cell `index` of the job in `slot`, from the map of its cell class, and
 * (in *capacity) how many elements it holds. The capacity is a constant on
 * each branch, which lets the verifier bound every access into the cell. */
static __always_inline struct xagg_chunk *lookup_cell(__u32 cell_class, __u32 slot, __u32 index, __u32 *capacity)
{
	void *cells;

	switch (cell_class) {
	case XAGG_CELL_CLASS_SMALL:
		cells = bpf_map_lookup_elem(&xagg_cells_small, &slot);
		*capacity = XAGG_CELL_ELEMS_SMALL;
		break;
	case XAGG_CELL_CLASS_MEDIUM:
		cells = bpf_map_lookup_elem(&xagg_cells_medium, &slot);
		*capacity = XAGG_CELL_ELEMS_MEDIUM;
		break;
	case XAGG_CELL_CLASS_LARGE:
		cells = bpf_map_lookup_elem(&xagg_cells_large, &slot);
		*capacity = XAGG_CELL_ELEMS_LARGE;
		break;
	case XAGG_CELL_CLASS_NARROW_JUMBO:
		cells = bpf_map_lookup_elem(&xagg_cells_narrow_jumbo, &slot);
		*capacity = XAGG_CELL_ELEMS_NARROW_JUMBO;
		break;
	default:
		return NULL;
	}
	return cells ? bpf_map_lookup_elem(cells, &index) : NULL;
}

/* Leaf jobs by their parent's address and job id: where a parent's RESULT goes. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, XAGG_MAX_JOBS);
	__type(key, struct xagg_parent_key);
	__type(value, __u32); /* the leaf job's id */
} xagg_parents SEC(".maps");

/* CPUs that send completed chunks' results (xagg_send_result), key = CPU;
 * filled by the control plane when result fan-out is on. */
struct {
	__uint(type, BPF_MAP_TYPE_CPUMAP);
	__uint(max_entries, XAGG_MAX_CPUS);
	__type(key, __u32);
	__type(value, struct bpf_cpumap_val);
} xagg_result_cpus SEC(".maps");

/* The same CPUs' queues for results the tc fan-out copies (unicast jobs,
 * reduce-scatter chunks): no program, so the cpumap passes them to the stack. */
struct {
	__uint(type, BPF_MAP_TYPE_CPUMAP);
	__uint(max_entries, XAGG_MAX_CPUS);
	__type(key, __u32);
	__type(value, struct bpf_cpumap_val);
} xagg_pass_cpus SEC(".maps");

/* Entry 0: the interface the aggregator runs on, where results leave. */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct bpf_devmap_val);
} xagg_egress SEC(".maps");

/* Per-CPU copy of a later share's payload, which may span fragments, added
 * into its cell from here (xagg_aggregator.bpf.c, merge_into_cell); int32 or
 * 16-bit lanes. A 16-bit cell's rescaled result is written here too. */
struct xagg_share {
	union {
		__s32 value[XAGG_CHUNK_ELEMS];
		__s16 lanes[XAGG_NARROW_CHUNK_ELEMS];
	};
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xagg_share);
} xagg_shares SEC(".maps");

#endif
