// C++ view of the XAgg wire format (bpf/include/xagg_wire.h, docs/protocol.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "xagg_structs.h"
#include "xagg_wire.h"

namespace xagg::wire {

// The most elements a chunk has: a job on links with an MTU of at least
// kJumboMtu uses this many; smaller MTUs give smaller chunks (chunk_elements_for).
inline constexpr size_t kChunkElems = XAGG_CHUNK_ELEMS;
// The most elements of a chunk on the 16-bit wire (docs/protocol.md section
// 11), and so of any chunk: the same bytes hold twice the lanes.
inline constexpr size_t kMaxChunkElems = XAGG_NARROW_CHUNK_ELEMS;
// A job's wire width: the bits of one element in its packets.
inline constexpr uint32_t kWideBits = 32;
inline constexpr uint32_t kNarrowBits = 16;
inline constexpr size_t kHeaderBytes = XAGG_HDR_BYTES;
inline constexpr size_t kPacketBytes = XAGG_PACKET_BYTES;  // the longest UDP payload
// IPv4 without options (20 bytes) and UDP (8) around a packet.
inline constexpr size_t kIpUdpBytes = 20 + 8;
// The MTU whose packets carry kChunkElems elements unfragmented.
inline constexpr size_t kJumboMtu = kPacketBytes + kIpUdpBytes;
// The smallest link MTU a job accepts (IPv6's minimum, that of many tunnels):
// 304 elements per packet, a 6.7 times finer grain than on jumbo links.
inline constexpr size_t kMinLinkMtu = 1280;
// A job's chunk size for the smallest path MTU of its ranks (docs/protocol.md,
// section 1): as many int32 elements as fit, a multiple of 8 (whole 32-byte
// vectors), at most kChunkElems; twice that many on the 16-bit wire (section
// 11). mtu >= kMinLinkMtu; wire_bits kWideBits or kNarrowBits.
constexpr uint32_t chunk_elements_for(uint32_t mtu, uint32_t wire_bits = kWideBits) {
  size_t fit = (mtu - kIpUdpBytes - kHeaderBytes) / sizeof(int32_t) / 8 * 8;
  size_t wide = fit < kChunkElems ? fit : kChunkElems;
  return static_cast<uint32_t>(wire_bits == kNarrowBits ? 2 * wide : wide);
}
inline constexpr uint32_t kMinChunkElems = chunk_elements_for(kMinLinkMtu);
// A receive buffer per datagram: one byte more than the longest packet shows
// an oversized datagram as MSG_TRUNC, and a cache-line multiple keeps every
// buffer's int32 payload aligned.
inline constexpr size_t kReceiveSlotBytes = (kPacketBytes + 1 + 63) / 64 * 64;
// UDP payload of a packet carrying `elements` values: int32 (1 .. kChunkElems)
// or, narrow, 16-bit lanes (1 .. kMaxChunkElems).
constexpr size_t packet_bytes(size_t elements, bool narrow = false) {
  return kHeaderBytes + elements * (narrow ? sizeof(int16_t) : sizeof(int32_t));
}
inline constexpr uint16_t kDefaultDataPort = 9987;
inline constexpr uint16_t kDefaultControlPort = 9988;
static_assert(sizeof(xagg_hdr) == kHeaderBytes);

// Header flags (docs/protocol.md section 3.1): RESEND and CE on RESULTs;
// SCATTER on both, OWNER on DATA (reduce-scatter, section 10).
inline constexpr uint8_t kFlagResend = XAGG_FLAG_RESEND;
inline constexpr uint8_t kFlagCongestionExperienced = XAGG_FLAG_CE;
inline constexpr uint8_t kFlagScatter = XAGG_FLAG_SCATTER;
inline constexpr uint8_t kFlagOwner = XAGG_FLAG_OWNER;
inline constexpr uint8_t kFlagNarrow = XAGG_FLAG_NARROW;  // 16-bit lanes (section 11)
inline constexpr int kEcnMask = XAGG_ECN_MASK;
inline constexpr int kEcnEct0 = XAGG_ECN_ECT0;
inline constexpr int kEcnCe = XAGG_ECN_CE;

enum class MsgType : uint8_t { Data = XAGG_MSG_DATA, Result = XAGG_MSG_RESULT };
enum class ElemOp : uint8_t { Sum = XAGG_OP_SUM, Max = XAGG_OP_MAX, Or = XAGG_OP_OR };

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

// Parses and validates a whole packet (header plus 1 .. kChunkElems int32
// elements, or with kFlagNarrow 1 .. kMaxChunkElems 16-bit lanes, or none for
// a reduce-scatter RESULT).
struct Decoded {
  std::optional<Header> header;
  uint32_t elements = 0;  // payload elements (lanes, when narrow)
  DecodeError error{};
  bool narrow() const { return header && (header->flags & kFlagNarrow) != 0; }
};
Decoded decode_packet(std::span<const std::byte> packet);

// Payload views: the little-endian int32 elements (or 16-bit lanes) after the header.
inline const int32_t* payload(const std::byte* packet) {
  return reinterpret_cast<const int32_t*>(packet + kHeaderBytes);
}
inline int32_t* payload(std::byte* packet) { return reinterpret_cast<int32_t*>(packet + kHeaderBytes); }
inline const int16_t* narrow_payload(const std::byte* packet) {
  return reinterpret_cast<const int16_t*>(packet + kHeaderBytes);
}
inline int16_t* narrow_payload(std::byte* packet) { return reinterpret_cast<int16_t*>(packet + kHeaderBytes); }

// 16-bit lanes from int32 values, each clamped to int16's range (the
// exponent sentinels become int16's extremes), and back by sign extension.
void narrow_lanes(std::span<const int32_t> values, int16_t* lanes);
void widen_lanes(const int16_t* lanes, std::span<int32_t> values);
// A 16-bit SUM's result lane: sum / 2^shift rounded to nearest, ties to even
// (docs/protocol.md section 11), as the aggregators compute it.
constexpr int32_t rescale_sum(int32_t sum, uint32_t shift) {
  if (shift == 0) return sum;
  const int32_t floor = sum >> shift;  // arithmetic: toward -infinity
  const int32_t rest = sum - static_cast<int32_t>(static_cast<uint32_t>(floor) << shift);
  return floor + ((rest + (floor & 1)) > (int32_t{1} << (shift - 1)) ? 1 : 0);
}

// Elements that share a quantization exponent on the 16-bit wire
// (docs/protocol.md section 11): a block, so that one large element costs
// the precision of its block's other elements, not of its whole chunk's.
inline constexpr uint32_t kNarrowBlockElems = 32;
// Exponents a chunk of 16-bit lanes has at most: its memory of them (section 5.3).
inline constexpr uint32_t kMaxBlocksPerChunk = kMaxChunkElems / kNarrowBlockElems;

// How an all-reduce's (or a job's) chunk index space is laid out: the chunks
// that carry the quantization exponents first (see include/xagg/quantize.h),
// then the data chunks of chunk_elements elements. One exponent per data
// chunk, or with blocks (16-bit lanes) one per kNarrowBlockElems of each,
// blocks_per_chunk of them, so that an exponent chunk covers fewer data chunks.
struct ChunkLayout {
  uint32_t data_chunks = 0;
  uint32_t exponent_chunks = 0;
  uint32_t blocks_per_chunk = 1;           // exponents per data chunk
  uint32_t chunks_per_exponent_chunk = 1;  // data chunks whose exponents one exponent chunk carries
  uint32_t total() const { return data_chunks + exponent_chunks; }
};
ChunkLayout layout_for(uint64_t elements, uint32_t chunk_elements, bool blocks = false);
// The most elements whose layout's chunk indexes fit in 32 bits.
uint64_t max_layout_elements(uint32_t chunk_elements);

// The arrival mask of a cell every rank contributed to: bit r for rank r (world_size 1..64).
constexpr uint64_t all_ranks_mask(uint32_t world_size) {
  return world_size >= 64 ? ~uint64_t{0} : (uint64_t{1} << world_size) - 1;
}

// The cell size class (bpf/include/xagg_structs.h) of a job whose chunks have
// chunk_elements (1 .. kMaxChunkElems) elements: the smallest that holds a chunk.
xagg_cell_class cell_class_for(uint32_t chunk_elements);
// Elements one cell of the class holds.
uint32_t cell_capacity(xagg_cell_class cell_class);
// Bytes of aggregator memory (two cells per chunk) a job of this many chunks
// of chunk_elements elements takes.
uint64_t cell_bytes(uint32_t chunks, uint32_t chunk_elements);

// How a job's RESULTs reach its ranks (docs/protocol.md section 2, "start").
enum class ResultMode : uint8_t {
  Broadcast = XAGG_RESULTS_BROADCAST,  // the aggregator subnet's directed broadcast: one segment
  Multicast = XAGG_RESULTS_MULTICAST,  // the job's IPv4 multicast group, which every rank joins
  Unicast = XAGG_RESULTS_UNICAST,      // one copy per rank: routed networks without multicast
};
std::string_view to_string(ResultMode mode);  // "broadcast", "multicast", "unicast"
// nullopt for any other text.
std::optional<ResultMode> parse_result_mode(std::string_view text);

}  // namespace xagg::wire
