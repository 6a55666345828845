// Wire format of the TCP parameter-server baseline. Both ends run on the same
// kind of host (little-endian x86-64/arm64), so structs travel as raw bytes.
//
//   worker -> server  Hello, then per all-reduce: Request + count float32
//   server -> worker  HelloReply (+ message), then per all-reduce: a stream of
//                     Frames; a Result frame carries the next summed chunk, an
//                     Error frame a message after which the server closes.
//
// A client shards each tensor over K servers: every server is a separate
// connection carrying one contiguous piece, so its Request.iteration counts
// only the all-reduces whose piece for it is not empty.
#pragma once

#include <cstddef>
#include <cstdint>

namespace xagg::baselines::tcp_ps {

inline constexpr uint32_t kMagic = 0x31535058;  // "XPS1"
inline constexpr size_t kDefaultChunkBytes = 256 * 1024;
inline constexpr int kDefaultSocketBufferBytes = 4 << 20;
inline constexpr uint32_t kMaxMessageBytes = 4096;

struct Hello {
  uint32_t magic = kMagic;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint32_t reserved = 0;
  uint64_t max_elements = 0;
};
static_assert(sizeof(Hello) == 24);

enum class HelloStatus : uint32_t { Accepted = 0, Rejected = 1 };

struct HelloReply {
  uint32_t magic = kMagic;
  HelloStatus status = HelloStatus::Accepted;
  uint32_t message_bytes = 0;  // length of the reason that follows
  uint32_t world_size = 0;
};
static_assert(sizeof(HelloReply) == 16);

struct Request {
  uint64_t iteration = 0;  // 0, 1, ... on each connection; all ranks must agree
  uint64_t count = 0;      // float32 elements that follow
};
static_assert(sizeof(Request) == 16);

enum class FrameType : uint32_t { Result = 1, Error = 2 };

struct FrameHeader {
  FrameType type = FrameType::Result;
  uint32_t payload_bytes = 0;
};
static_assert(sizeof(FrameHeader) == 8);

}  // namespace xagg::baselines::tcp_ps
