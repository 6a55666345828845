#include "wire.h"

#include <endian.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "xagg_structs.h"

namespace xagg::wire {

static_assert(kChunkElems == 2048 && kMaxChunkElems == 4096, "DecodeError::BadLength's message names the chunk sizes");
static_assert(std::endian::native == std::endian::little,
              "payload elements are little-endian and used in place");

std::string_view to_string(DecodeError error) {
  switch (error) {
    case DecodeError::TooShort: return "packet too short";
    case DecodeError::BadMagic: return "bad magic";
    case DecodeError::BadVersion: return "unsupported version";
    case DecodeError::BadType: return "unknown message type";
    case DecodeError::BadOp: return "unknown element operation";
    case DecodeError::BadLength: return "payload is not 1 to 2048 whole int32 elements (1 to 4096 16-bit lanes)";
  }
  return "unknown error";
}

void encode_header(const Header& header, std::span<std::byte> out) {
  xagg_hdr hdr{};
  hdr.magic = htobe16(XAGG_MAGIC);
  hdr.version = XAGG_VERSION;
  hdr.type = static_cast<uint8_t>(header.type);
  hdr.job_id = htobe32(header.job_id);
  hdr.token = htobe64(header.token);
  hdr.iteration = htobe32(header.iteration);
  hdr.chunk = htobe32(header.chunk);
  hdr.rank = htobe16(header.rank);
  hdr.op = static_cast<uint8_t>(header.op);
  hdr.flags = header.flags;
  hdr.total = htobe32(header.total);
  std::memcpy(out.data(), &hdr, sizeof(hdr));
}

Decoded decode_packet(std::span<const std::byte> packet) {
  auto reject = [](DecodeError error) { return Decoded{std::nullopt, 0, error}; };
  if (packet.size() < kHeaderBytes) return reject(DecodeError::TooShort);
  xagg_hdr hdr;
  std::memcpy(&hdr, packet.data(), sizeof(hdr));
  // In the order of docs/protocol.md 3.4, so that both engines count a bad packet alike.
  const size_t payload_bytes = packet.size() - kHeaderBytes;
  // Only a reduce-scatter RESULT to a rank not owning the chunk may be the header alone.
  const bool header_only_allowed = hdr.type == XAGG_MSG_RESULT && (hdr.flags & XAGG_FLAG_SCATTER) != 0;
  const size_t element_bytes = (hdr.flags & XAGG_FLAG_NARROW) != 0 ? sizeof(int16_t) : sizeof(int32_t);
  if ((payload_bytes == 0 && !header_only_allowed) || packet.size() > kPacketBytes ||
      payload_bytes % element_bytes != 0)
    return reject(DecodeError::BadLength);
  if (be16toh(hdr.magic) != XAGG_MAGIC) return reject(DecodeError::BadMagic);
  if (hdr.type != XAGG_MSG_DATA && hdr.type != XAGG_MSG_RESULT) return reject(DecodeError::BadType);
  // OR is the 16-bit wire's (its NaN and Inf kinds) and comes only with NARROW.
  if (hdr.op >= XAGG_OP_COUNT || (hdr.op == XAGG_OP_OR && (hdr.flags & XAGG_FLAG_NARROW) == 0))
    return reject(DecodeError::BadOp);
  if (hdr.version != XAGG_VERSION) return reject(DecodeError::BadVersion);
  Header header;
  header.type = static_cast<MsgType>(hdr.type);
  header.job_id = be32toh(hdr.job_id);
  header.token = be64toh(hdr.token);
  header.iteration = be32toh(hdr.iteration);
  header.chunk = be32toh(hdr.chunk);
  header.rank = be16toh(hdr.rank);
  header.op = static_cast<ElemOp>(hdr.op);
  header.flags = hdr.flags;
  header.total = be32toh(hdr.total);
  return {header, static_cast<uint32_t>(payload_bytes / element_bytes)};
}

void narrow_lanes(std::span<const int32_t> values, int16_t* lanes) {
  for (size_t i = 0; i < values.size(); ++i)
    lanes[i] = static_cast<int16_t>(std::clamp<int32_t>(values[i], INT16_MIN, INT16_MAX));
}

void widen_lanes(const int16_t* lanes, std::span<int32_t> values) {
  for (size_t i = 0; i < values.size(); ++i) values[i] = lanes[i];
}

ChunkLayout layout_for(uint64_t elements, uint32_t chunk_elements, bool blocks) {
  ChunkLayout layout;
  layout.data_chunks = static_cast<uint32_t>((elements + chunk_elements - 1) / chunk_elements);
  layout.blocks_per_chunk = blocks ? (chunk_elements + kNarrowBlockElems - 1) / kNarrowBlockElems : 1;
  layout.chunks_per_exponent_chunk = chunk_elements / layout.blocks_per_chunk;
  layout.exponent_chunks =
      (layout.data_chunks + layout.chunks_per_exponent_chunk - 1) / layout.chunks_per_exponent_chunk;
  return layout;
}

// Data chunks D with D + ceil(D / c) <= 2^32 - 1, times c elements each.
uint64_t max_layout_elements(uint32_t chunk_elements) {
  uint64_t data_chunks = (uint64_t{UINT32_MAX} - 1) * chunk_elements / (chunk_elements + 1);
  return data_chunks * chunk_elements;
}

namespace {
constexpr std::array<uint32_t, XAGG_CELL_CLASSES> kCellCapacities{XAGG_CELL_ELEMS_SMALL, XAGG_CELL_ELEMS_MEDIUM,
                                                                   XAGG_CELL_ELEMS_LARGE, XAGG_CELL_ELEMS_NARROW_JUMBO};
static_assert(std::ranges::is_sorted(kCellCapacities) && kCellCapacities.back() == kMaxChunkElems);
static_assert(std::ranges::all_of(kCellCapacities, [](uint32_t elems) { return elems % XAGG_CELL_BLOCK_ELEMS == 0; }),
              "the XDP merge adds whole blocks");
// The classes fit the chunks of the common MTUs closely.
static_assert(chunk_elements_for(1500) <= XAGG_CELL_ELEMS_SMALL && chunk_elements_for(4000) <= XAGG_CELL_ELEMS_MEDIUM);
}  // namespace

xagg_cell_class cell_class_for(uint32_t chunk_elements) {
  if (chunk_elements == 0 || chunk_elements > kMaxChunkElems)
    throw std::invalid_argument(fmt::format("a chunk of {} elements is not in 1..{}", chunk_elements, kMaxChunkElems));
  auto fitting = std::ranges::find_if(kCellCapacities, [&](uint32_t capacity) { return chunk_elements <= capacity; });
  return static_cast<xagg_cell_class>(fitting - kCellCapacities.begin());
}

uint32_t cell_capacity(xagg_cell_class cell_class) { return kCellCapacities.at(cell_class); }

uint64_t cell_bytes(uint32_t chunks, uint32_t chunk_elements) {
  return 2ull * chunks * XAGG_CELL_BYTES(cell_capacity(cell_class_for(chunk_elements)));
}

std::string_view to_string(ResultMode mode) {
  switch (mode) {
    case ResultMode::Broadcast: return "broadcast";
    case ResultMode::Multicast: return "multicast";
    case ResultMode::Unicast: return "unicast";
  }
  return "unknown";
}

std::optional<ResultMode> parse_result_mode(std::string_view text) {
  for (ResultMode mode : {ResultMode::Broadcast, ResultMode::Multicast, ResultMode::Unicast})
    if (text == to_string(mode)) return mode;
  return std::nullopt;
}

}  // namespace xagg::wire
