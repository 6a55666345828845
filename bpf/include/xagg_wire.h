/* XAgg wire format, shared by the XDP data plane (C, BPF) and user space (C++).
 * docs/protocol.md is the normative description; keep both in step. */
#ifndef XAGG_WIRE_H
#define XAGG_WIRE_H

#include <linux/types.h>

#define XAGG_MAGIC 0x5841 /* "XA", big-endian on the wire */
#define XAGG_VERSION 9

/* The most elements per chunk: a DATA or RESULT packet carries 1 to this many
 * int32 values, its length telling how many (a tensor's last chunk is short;
 * no padding goes on the wire). 2048 * 4 = 8192 bytes with the headers fit a
 * 9000-byte MTU: every datagram pays the whole network stack, so the fewer
 * the better. A job on smaller MTUs uses fewer per chunk (docs/protocol.md). */
#define XAGG_CHUNK_ELEMS 2048
#define XAGG_PAYLOAD_BYTES (XAGG_CHUNK_ELEMS * 4) /* the most a packet carries */
/* A job on the 16-bit wire (docs/protocol.md section 11) carries twice the
 * elements in the same bytes: up to this many per chunk. */
#define XAGG_NARROW_CHUNK_ELEMS (XAGG_PAYLOAD_BYTES / 2)

/* Ranks per job: one bit per rank in a 64-bit arrival mask. */
#define XAGG_MAX_WORKERS 64

/* The rank field of a RESULT that a leaf aggregator relays from its parent:
 * no rank of the leaf's job completed the chunk (docs/protocol.md section 9). */
#define XAGG_NO_RANK 0xffff

enum xagg_msg_type {
	XAGG_MSG_DATA = 1,   /* worker -> aggregator: one chunk of one worker */
	XAGG_MSG_RESULT = 2, /* aggregator -> workers: the completed chunk */
};

enum xagg_op {
	XAGG_OP_SUM = 0, /* wrapping int32 addition */
	XAGG_OP_MAX = 1, /* signed int32 maximum */
	XAGG_OP_OR = 2,  /* bitwise or (the 16-bit wire's NaN and Inf kinds) */
	XAGG_OP_COUNT,
};

enum xagg_flags {
	XAGG_FLAG_RESEND = 1, /* RESULT sent again, unicast, in answer to a duplicate DATA */
	XAGG_FLAG_CE = 2,     /* RESULT: a DATA share of the chunk arrived with CE set (ECN echo) */
	/* Reduce-scatter (docs/protocol.md section 10): only one rank, the owner,
	 * wants the chunk's values. DATA: set by every rank; RESULT: the owner
	 * gets the values, every other rank the header alone, rank = the owner. */
	XAGG_FLAG_SCATTER = 4,
	XAGG_FLAG_OWNER = 8, /* DATA of a SCATTER chunk: the sender is its owner */
	/* DATA and RESULT: the payload is 16-bit lanes, not int32 (protocol.md
	 * section 11). The aggregator sums them in 32-bit cells and returns a SUM
	 * divided by 2^(the job's sum shift), rounded to nearest, ties to even. */
	XAGG_FLAG_NARROW = 16,
};
#define XAGG_DATA_FLAGS (XAGG_FLAG_SCATTER | XAGG_FLAG_OWNER | XAGG_FLAG_NARROW)

/* The ECN field (the IPv4 TOS byte's low two bits): workers send DATA as
 * ECT(0); a congested hop sets CE. */
#define XAGG_ECN_MASK 3
#define XAGG_ECN_ECT0 2
#define XAGG_ECN_CE 3

/* All multi-byte header fields are big-endian (network order). Payload
 * elements are little-endian two's-complement int32 (int16 with XAGG_FLAG_NARROW). */
struct xagg_hdr {
	__be16 magic;
	__u8 version;
	__u8 type;      /* enum xagg_msg_type */
	__be32 job_id;
	__be64 token;   /* per-job secret handed out at join */
	__be32 iteration;
	__be32 chunk;
	__be16 rank;
	__u8 op;        /* enum xagg_op */
	__u8 flags;     /* enum xagg_flags */
	__be32 total;   /* elements of the all-reduce the chunk belongs to, mod 2^32 */
} __attribute__((packed));

#define XAGG_HDR_BYTES 32
#define XAGG_PACKET_BYTES (XAGG_HDR_BYTES + XAGG_PAYLOAD_BYTES) /* the longest UDP payload */

#endif
