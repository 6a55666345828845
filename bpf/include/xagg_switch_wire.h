/* Wire format of the switch-style (SwitchML) baseline, shared by
 * bpf/xagg_switch.bpf.c and src/baselines/switch. Not part of the XAgg
 * protocol: it exists to compare against a slot-pool aggregator. */
#ifndef XAGG_SWITCH_WIRE_H
#define XAGG_SWITCH_WIRE_H

#include <linux/types.h>

#define XSW_MAGIC 0x5853 /* "XS", big-endian on the wire */

/* SwitchML's defaults (p4app-switchML, client_lib configs/general.cfg):
 * packet_numel = 256 elements per packet, max_outstanding_packets = 256,
 * i.e. a pool of 256 slots per worker. A job may use other packet sizes, up
 * to XAgg's 2048 elements (jumbo frames): the shares of one slot use must all
 * have the same length. */
#define XSW_DEFAULT_PACKET_ELEMS 256
#define XSW_MAX_PACKET_ELEMS 2048
#define XSW_MAX_PAYLOAD_BYTES (XSW_MAX_PACKET_ELEMS * 4)
#define XSW_DEFAULT_SLOTS 256
#define XSW_MAX_SLOTS 16384
#define XSW_MAX_WORKERS 64

enum xsw_msg_type {
	XSW_MSG_DATA = 1,
	XSW_MSG_RESULT = 2,
};

enum xsw_op {
	XSW_OP_SUM = 0, /* wrapping int32 addition */
	XSW_OP_MAX = 1, /* signed maximum, for the quantization exponents */
};

enum xsw_flags {
	XSW_FLAG_RESEND = 1, /* unicast answer to a retransmitted DATA of a complete slot */
};

/* Multi-byte fields big-endian; payload little-endian int32. */
struct xsw_hdr {
	__be16 magic;
	__u8 type;     /* enum xsw_msg_type */
	__u8 op;       /* enum xsw_op */
	__be32 job_id;
	__be64 token;
	__be16 rank;
	__be16 slot;   /* pool index, < the job's slot count */
	__u8 ver;      /* which of the slot's two copies (SwitchML's shadow copy) */
	__u8 flags;    /* enum xsw_flags */
	__be16 reserved;
	__be32 block;  /* the sender's block number: echoed, never interpreted by the aggregator */
	__be32 reserved2;
} __attribute__((packed));

#define XSW_HDR_BYTES 32
#define XSW_MAX_PACKET_BYTES (XSW_HDR_BYTES + XSW_MAX_PAYLOAD_BYTES) /* the longest UDP payload */

/* One copy of one slot: SwitchML's pool registers plus its per-worker
 * "seen" bits and arrival count. */
struct xsw_slot {
	__u32 busy;   /* the cell lock, as in the XAgg aggregator */
	__u32 count;  /* arrivals so far; 0 also means "complete" (SwitchML's modulo count) */
	__u64 seen;   /* ranks whose share is in this copy */
	__u32 op;
	__u32 elems;  /* the length of this use's shares: its first share's */
	__s32 value[XSW_MAX_PACKET_ELEMS];
};

/* A share that is added to a slot waits here, one per CPU: the payload may
 * span fragments and is copied out of the packet before the adds. */
struct xsw_share {
	__s32 value[XSW_MAX_PACKET_ELEMS];
};

/* The one job the aggregator serves, written by the daemon before the
 * workers start. */
struct xsw_config {
	__u32 job_id;
	__u32 world_size;
	__u32 slots;
	__be32 bcast_ip;
	__u64 token;
	__be16 result_port;
	__u16 active; /* 0 between jobs: every DATA is dropped */
	__u32 pad;
};

struct xsw_worker {
	__be32 ip;
	__be16 port;
	__u16 registered;
};

/* Per-CPU counters of the aggregator, summed by the daemon. */
enum xsw_counter {
	XSW_CNT_AGGREGATED,
	XSW_CNT_COMPLETED,
	XSW_CNT_RESENT,
	XSW_CNT_IGNORED,  /* retransmission of a share already counted, slot not complete */
	XSW_CNT_REJECTED, /* malformed, unknown job/worker, wrong source, slot out of range */
	XSW_CNT_CONTENDED,
	XSW_CNT_LENGTH_MISMATCH, /* a share whose length differs from the slot use's first */
	XSW_CNT_COUNT,
};

#endif
