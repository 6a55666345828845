/* Shared by the capacity bench's feeder (capacity_feed.bpf.c) and
 * bench_capacity.cpp. */
#ifndef XAGG_CAPACITY_FEED_H
#define XAGG_CAPACITY_FEED_H

#include <linux/types.h>
#include "xagg_wire.h"

/* Ethernet, IPv4 and UDP headers, then the XAgg header. */
#define FEED_HEADER_BYTES (14 + 20 + 8 + XAGG_HDR_BYTES)

/* One CPU's sender: the next share it feeds, and the chunk range it cycles. */
struct feed_state {
	__u32 rank;
	__u32 chunk;
	__u32 iteration;
	__u32 world_size;
	__u32 first_chunk;
	__u32 end_chunk;
	__u32 ranks_first; /* 1: a chunk's ranks back to back; 0: each rank sends every chunk in turn */
	__u32 pad;
};

struct feed_header {
	__u8 bytes[FEED_HEADER_BYTES];
};

#endif
