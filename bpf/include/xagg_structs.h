/* Counters and BPF map values shared by the XDP data plane and the control
 * plane in user space (src/dataplane). */
#ifndef XAGG_STRUCTS_H
#define XAGG_STRUCTS_H

#include <linux/types.h>
#include "xagg_wire.h"

/* CPUs that result fan-out can use (a cpumap cannot exceed the kernel's NR_CPUS). */
#define XAGG_MAX_CPUS 64

/* Concurrent jobs: rows of the chunk map-of-maps and of the stats map. */
#define XAGG_MAX_JOBS 64

/* Outcome counters, kept per job (and in a job-less row for packets that name
 * no known job). Indexes into the statistics map. */
enum xagg_counter {
	XAGG_CNT_AGGREGATED = 0, /* DATA added into a chunk that is still incomplete */
	XAGG_CNT_COMPLETED,      /* DATA that completed a chunk; RESULT broadcast */
	XAGG_CNT_DUPLICATE,      /* DATA from a rank already counted, chunk incomplete */
	XAGG_CNT_RESENT,         /* duplicate DATA for a complete chunk; RESULT unicast */
	XAGG_CNT_STALE,          /* DATA for an iteration older than the chunk's */
	XAGG_CNT_MALFORMED,      /* bad magic, type, length, reserved bits or op */
	XAGG_CNT_BAD_VERSION,
	XAGG_CNT_UNKNOWN_JOB,
	XAGG_CNT_BAD_TOKEN,
	XAGG_CNT_UNKNOWN_WORKER, /* rank not registered for the job */
	XAGG_CNT_WRONG_SOURCE,   /* rank registered, but from another IPv4 address or port */
	XAGG_CNT_OUT_OF_RANGE,   /* chunk index beyond the job's chunks */
	XAGG_CNT_OP_MISMATCH,    /* op differs from the op the chunk was started with */
	XAGG_CNT_LENGTH_MISMATCH,/* element count, of the share or of its all-reduce, differs from the first share's */
	XAGG_CNT_CONTENDED,      /* cell stayed locked by other CPUs; dropped, sender resends */
	XAGG_CNT_UNICAST_COPIES, /* RESULT copies the unicast fan-out sent, one per rank of a completed
				  * chunk (broadcast and multicast send one copy per chunk) */
	XAGG_CNT_SENT_UP,        /* leaf: completed (or re-requested) chunks sent to the parent as this leaf's share */
	XAGG_CNT_RELAYED_DOWN,   /* leaf: the parent's RESULTs passed on to the job's ranks */
	XAGG_CNT_SCATTER_HEADERS,/* header-only RESULT copies of reduce-scatter chunks for the ranks not owning
				  * them: one per rank (XDP), one broadcast (the user-space engine) */
	XAGG_CNT_COUNT,
};

/* Row XAGG_MAX_JOBS of the statistics map counts packets without a job. */
#define XAGG_STATS_ROWS (XAGG_MAX_JOBS + 1)
#define XAGG_STATS_NO_JOB_ROW XAGG_MAX_JOBS

/* How a job's completed chunks reach its ranks (docs/protocol.md section 2). */
enum xagg_result_mode {
	XAGG_RESULTS_BROADCAST = 0, /* one copy to the subnet's directed broadcast */
	XAGG_RESULTS_MULTICAST = 1, /* one copy to the job's IPv4 multicast group */
	XAGG_RESULTS_UNICAST = 2,   /* one copy per rank, cloned by the tc program */
};

/* Map values written by the control plane and read by XDP. */

/* A leaf job's membership in its parent's job (docs/design.md, "Hierarchy"):
 * a completed chunk goes up as the leaf's share, from local_ip and the data
 * port to next_hop_mac (the parent, or the router before it, which the
 * control plane resolved), and the parent's RESULTs come back to that port.
 * Network order except the token, which is in host order like xagg_job's. */
struct xagg_uplink {
	__u64 parent_token;
	__be32 parent_ip;
	__be32 parent_job_id;
	__be32 local_ip;     /* this aggregator's address towards the parent */
	__be16 parent_port;  /* the parent's data port */
	__be16 parent_rank;  /* this leaf's rank in the parent's job */
	__u8 local_mac[6];   /* of the interface: the source of shares sent up and of relayed RESULTs */
	__u8 next_hop_mac[6];
	__u8 pad[4];
};

/* xagg_parents key: the parent's RESULTs name its job, not ours. */
struct xagg_parent_key {
	__be32 parent_ip;
	__u32 parent_job_id; /* host order */
};

struct xagg_job {
	__u64 token;       /* host order */
	__u64 full_mask;   /* bit r set for every rank r < world_size */
	__u32 slot;        /* row in the chunk map-of-maps and in the stats map */
	__u32 num_chunks;  /* chunk indexes 0 .. num_chunks-1 are valid */
	__be32 result_ip;  /* broadcast or multicast: where RESULTs go */
	__be16 result_port;/* UDP port every worker of the job listens on */
	__u16 world_size;
	__u32 cell_class;  /* enum xagg_cell_class: which map of maps holds its cells */
	__u8 result_mode;  /* enum xagg_result_mode */
	__u8 has_uplink;   /* 1: a leaf job; its chunks complete at the parent */
	__u8 sum_shift;    /* a 16-bit SUM's result is the cell's sum / 2^sum_shift, rounded */
	__u8 pad;
	struct xagg_uplink uplink;
};

struct xagg_worker_key {
	__u32 job_id;
	__u32 rank;
};

struct xagg_worker {
	__be32 ip;
	__be16 port;
	/* The source MAC of its latest DATA, learned by XDP: the next hop (the
	 * worker, or the router before it) that unicast RESULTs go to. */
	__u8 next_hop_mac[6];
};

/* The data of a BPF_PROG_RUN of xagg_touch_cells (padded to a minimal frame
 * by the caller): which job's array, and which of its cells, to touch. */
struct xagg_touch_request {
	__u32 cell_class;
	__u32 slot;
	__u32 first;
	__u32 count; /* at most bpf_loop's limit, 1 << 23 */
};

/* One aggregation cell: a chunk's running result for one iteration parity.
 * Each chunk has two cells (iteration & 1) so that a worker already sending
 * iteration i+1 cannot disturb iteration i, whose result may still have to be
 * resent to a worker that lost it. */
struct xagg_chunk {
	__u32 busy;      /* cell lock: 1 while one CPU merges into the cell */
	__u32 iteration;
	__u64 arrived;   /* bit r set once rank r's share is in */
	__u32 started;   /* 0 until the first share of any iteration lands */
	__u16 op;        /* enum xagg_op the cell was started with */
	__u16 elems;     /* elements of the first share; every share must match */
	__u32 total;     /* its all-reduce's element count; every share must match */
	/* The latest share of this iteration whose all-reduce had another element
	 * count (0: none), so that every rank can be told the sizes differ. */
	__u32 conflict_total;
	__u32 conflict_rank;
	__u32 congested; /* 1 once a share of this iteration arrived with CE set: echoed in the RESULT */
	__u16 scatter;   /* 1: a reduce-scatter chunk, whose values go to its owner alone */
	__u16 owner;     /* the rank whose share carried XAGG_FLAG_OWNER; XAGG_NO_RANK: none yet */
	__u32 narrow;    /* 1: the shares are 16-bit lanes, summed here as int32 */
	/* A leaf job's ranks that asked for this complete cell's result again
	 * since the parent last answered such a request: where the parent's
	 * resent RESULT goes (protocol.md section 9). */
	__u64 asked_again;
	/* As many elements as the job's cell class holds (XAGG_CELL_BYTES):
	 * XAGG_CELL_ELEMS_MAX is only the largest class. A 16-bit lane is summed
	 * into an int32 cell too: 64 ranks of 2^15 need 21 bits. */
	__s32 value[XAGG_NARROW_CHUNK_ELEMS];
};

/* Cell size classes. A job's chunk size follows its MTU (360 elements at
 * 1500, 984 at 4000, 2048 on jumbo links), and its cells come from the
 * smallest class that holds a chunk, so that a job on small-MTU links reserves
 * about what it sends rather than jumbo cells. Each class is one map of maps
 * (inner arrays must match their template's value size). Capacities are whole
 * merge blocks (XAGG_CELL_BLOCK_ELEMS), the unit the XDP merge loop adds. */
#define XAGG_CELL_BLOCK_ELEMS 64
enum xagg_cell_class {
	XAGG_CELL_CLASS_SMALL,  /* chunks up to 384 elements: MTU 1280 .. 1596 */
	XAGG_CELL_CLASS_MEDIUM, /* up to 1024: MTU .. 4156 */
	XAGG_CELL_CLASS_LARGE,  /* up to XAGG_CHUNK_ELEMS */
	XAGG_CELL_CLASS_NARROW_JUMBO, /* up to XAGG_NARROW_CHUNK_ELEMS: 16-bit lanes on jumbo links */
	XAGG_CELL_CLASSES,
};
#define XAGG_CELL_ELEMS_SMALL 384
#define XAGG_CELL_ELEMS_MEDIUM 1024
#define XAGG_CELL_ELEMS_LARGE XAGG_CHUNK_ELEMS
#define XAGG_CELL_ELEMS_NARROW_JUMBO XAGG_NARROW_CHUNK_ELEMS
#define XAGG_CELL_ELEMS_MAX XAGG_NARROW_CHUNK_ELEMS
/* Bytes of one cell whose value holds `elems` elements. */
#define XAGG_CELL_BYTES(elems) (__builtin_offsetof(struct xagg_chunk, value) + (elems) * 4)

#endif
