// C++ view of the XAgg wire format (bpf/include/xagg_wire.h, docs/protocol.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "xagg_wire.h"

namespace xagg::wire {

inline constexpr size_t kChunkElems = XAGG_CHUNK_ELEMS;
inline constexpr size_t kHeaderBytes = XAGG_HDR_BYTES;
inline constexpr size_t kPacketBytes = XAGG_PACKET_BYTES;  // the longest UDP payload
// The smallest link MTU that carries the longest packet unfragmented: IPv4
// without options (20 bytes) and UDP (8) around kPacketBytes.
inline constexpr size_t kMinLinkMtu = kPacketBytes + 20 + 8;
// A receive buffer per datagram: one byte more than the longest packet shows
// an oversized datagram as MSG_TRUNC, and a cache-line multiple keeps every
// buffer's int32 payload aligned.
inline constexpr size_t kReceiveSlotBytes = (kPacketBytes + 1 + 63) / 64 * 64;
// UDP payload of a packet carrying `elements` (1 .. kChunkElems) values.
constexpr size_t packet_bytes(size_t elements) { return kHeaderBytes + elements * sizeof(int32_t); }
inline constexpr uint16_t kDefaultDataPort = 9987;
inline constexpr uint16_t kDefaultControlPort = 9988;
static_assert(sizeof(xagg_hdr) == kHeaderBytes);

enum class MsgType : uint8_t { Data = XAGG_MSG_DATA, Result = XAGG_MSG_RESULT };
enum class ElemOp : uint8_t { Sum = XAGG_OP_SUM, Max = XAGG_OP_MAX };

// Header fields in host byte order.
struct Header {
  MsgType type = MsgType::Data;
  uint32_t job_id = 0;
  uint64_t token = 0;
  uint32_t iteration = 0;
  uint32_t chunk = 0;
  uint16_t rank = 0;
  ElemOp op = ElemOp::Sum;
  uint8_t flags = 0;
  uint32_t total = 0;  // elements of the chunk's all-reduce, mod 2^32: every rank's must match
  bool operator==(const Header&) const = default;
};

enum class DecodeError { TooShort, BadMagic, BadVersion, BadType, BadOp, BadLength };
std::string_view to_string(DecodeError error);

// Writes the 32-byte header at the start of out (out.size() >= kHeaderBytes).
void encode_header(const Header& header, std::span<std::byte> out);

// Parses and validates a whole packet (header plus 1 .. kChunkElems elements).
struct Decoded {
  std::optional<Header> header;
  uint32_t elements = 0;  // payload elements
  DecodeError error{};
};
Decoded decode_packet(std::span<const std::byte> packet);

// Payload views: the little-endian int32 elements after the header.
inline const int32_t* payload(const std::byte* packet) {
  return reinterpret_cast<const int32_t*>(packet + kHeaderBytes);
}
inline int32_t* payload(std::byte* packet) { return reinterpret_cast<int32_t*>(packet + kHeaderBytes); }

// How a job's chunk index space is laid out: data chunks first, then the
// chunks that carry one quantization exponent per data chunk (see include/xagg/quantize.h).
struct ChunkLayout {
  uint32_t data_chunks = 0;
  uint32_t exponent_chunks = 0;
  uint32_t total() const { return data_chunks + exponent_chunks; }
};
ChunkLayout layout_for(uint64_t elements);

// The arrival mask of a cell every rank contributed to: bit r for rank r (world_size 1..64).
constexpr uint64_t all_ranks_mask(uint32_t world_size) {
  return world_size >= 64 ? ~uint64_t{0} : (uint64_t{1} << world_size) - 1;
}

// Bytes of aggregator memory (two cells per chunk) a job of this many chunks takes.
uint64_t cell_bytes(uint32_t chunks);

}  // namespace xagg::wire
