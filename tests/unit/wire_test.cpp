#include "wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace xagg::wire {
namespace {

Header sample_header() {
  return Header{MsgType::Result, 0xdeadbeef, 0xfedcba9876543210ull, 0x80000001u, 123456, 63, ElemOp::Max,
                XAGG_FLAG_RESEND, 0x0a0b0c0d};
}

std::vector<std::byte> encoded_packet(const Header& header) {
  std::vector<std::byte> packet(kPacketBytes);
  encode_header(header, packet);
  return packet;
}

TEST(Wire, HeaderRoundTrip) {
  Header header = sample_header();
  Decoded decoded = decode_packet(encoded_packet(header));
  ASSERT_TRUE(decoded.header) << to_string(decoded.error);
  EXPECT_TRUE(*decoded.header == header);  // every field
}

TEST(Wire, HeaderFieldsAreBigEndian) {
  auto packet = encoded_packet(sample_header());
  const auto* bytes = reinterpret_cast<const uint8_t*>(packet.data());
  EXPECT_EQ(bytes[0], 0x58);  // 'X'
  EXPECT_EQ(bytes[1], 0x41);  // 'A'
  EXPECT_EQ(bytes[2], XAGG_VERSION);
  EXPECT_EQ(bytes[3], XAGG_MSG_RESULT);
  EXPECT_EQ(bytes[4], 0xde);  // job id, most significant byte first
  EXPECT_EQ(bytes[8], 0xfe);  // token
  EXPECT_EQ(bytes[15], 0x10);
  EXPECT_EQ(bytes[28], 0x0a);  // total
}

struct Corruption {
  const char* name;
  size_t offset;
  uint8_t value;
  DecodeError expected;
};

class WireDecodeError : public ::testing::TestWithParam<Corruption> {};

TEST_P(WireDecodeError, IsReported) {
  auto packet = encoded_packet(sample_header());
  packet[GetParam().offset] = std::byte{GetParam().value};
  Decoded decoded = decode_packet(packet);
  EXPECT_FALSE(decoded.header);
  EXPECT_EQ(decoded.error, GetParam().expected) << to_string(decoded.error);
}

INSTANTIATE_TEST_SUITE_P(
    EveryField, WireDecodeError,
    ::testing::Values(Corruption{"magic", 0, 0x00, DecodeError::BadMagic},
                      Corruption{"version", 2, XAGG_VERSION + 1, DecodeError::BadVersion},
                      Corruption{"type_zero", 3, 0, DecodeError::BadType},
                      Corruption{"type_three", 3, 3, DecodeError::BadType},
                      Corruption{"op", 26, XAGG_OP_COUNT, DecodeError::BadOp},
                      Corruption{"op_or_without_narrow", 26, XAGG_OP_OR, DecodeError::BadOp}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Wire, ShortAndWrongLengthPacketsAreRejected) {
  auto packet = encoded_packet(sample_header());
  EXPECT_EQ(decode_packet(std::span(packet).first(kHeaderBytes - 1)).error, DecodeError::TooShort);
  EXPECT_EQ(decode_packet(std::span(packet).first(0)).error, DecodeError::TooShort);
  EXPECT_EQ(decode_packet(std::span(packet).first(kHeaderBytes)).error, DecodeError::BadLength);
  EXPECT_EQ(decode_packet(std::span(packet).first(packet_bytes(1) + 2)).error, DecodeError::BadLength);
  EXPECT_EQ(decode_packet(std::span(packet).first(kPacketBytes - 1)).error, DecodeError::BadLength);
  packet.resize(kPacketBytes + 4);
  EXPECT_EQ(decode_packet(packet).error, DecodeError::BadLength);
}

// Only a reduce-scatter RESULT may be the header alone (protocol.md section 10).
TEST(Wire, OnlyAScatterResultMayCarryNoElements) {
  Header header = sample_header();
  header.flags = XAGG_FLAG_SCATTER;
  auto packet = encoded_packet(header);
  Decoded decoded = decode_packet(std::span(packet).first(kHeaderBytes));
  ASSERT_TRUE(decoded.header) << to_string(decoded.error);
  EXPECT_EQ(decoded.elements, 0u);
  header.type = MsgType::Data;
  packet = encoded_packet(header);
  EXPECT_EQ(decode_packet(std::span(packet).first(kHeaderBytes)).error, DecodeError::BadLength);
}

TEST(Wire, LengthCountsTheElements) {
  auto packet = encoded_packet(sample_header());
  for (size_t elements : {size_t{1}, size_t{100}, kChunkElems}) {
    Decoded decoded = decode_packet(std::span(packet).first(packet_bytes(elements)));
    ASSERT_TRUE(decoded.header) << to_string(decoded.error);
    EXPECT_EQ(decoded.elements, elements);
  }
}

TEST(Wire, EveryDecodeErrorHasItsOwnText) {
  std::vector<std::string_view> texts;
  for (auto error : {DecodeError::TooShort, DecodeError::BadMagic, DecodeError::BadVersion, DecodeError::BadType,
                     DecodeError::BadOp, DecodeError::BadLength}) {
    for (auto seen : texts) EXPECT_NE(seen, to_string(error));
    texts.push_back(to_string(error));
  }
}

TEST(Wire, PayloadFollowsTheHeader) {
  auto packet = encoded_packet(sample_header());
  payload(packet.data())[0] = 0x01020304;
  EXPECT_EQ(packet[kHeaderBytes], std::byte{0x04});  // little-endian elements
}

struct LayoutCase {
  uint64_t elements;
  uint32_t data_chunks;
  uint32_t exponent_chunks;
};

class Layout : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(Layout, CountsDataThenExponentChunks) {
  ChunkLayout layout = layout_for(GetParam().elements, kChunkElems);
  EXPECT_EQ(layout.data_chunks, GetParam().data_chunks);
  EXPECT_EQ(layout.exponent_chunks, GetParam().exponent_chunks);
  EXPECT_EQ(layout.total(), GetParam().data_chunks + GetParam().exponent_chunks);
}

// Chunk sizes per MTU (docs/protocol.md section 1): whole 32-byte vectors that fit in one datagram.
TEST(ChunkElementsForMtu, FillsThePacketInWholeVectors) {
  EXPECT_EQ(chunk_elements_for(1280), 304u);
  EXPECT_EQ(chunk_elements_for(1500), 360u);
  EXPECT_EQ(chunk_elements_for(4000), 984u);
  EXPECT_EQ(chunk_elements_for(kJumboMtu - 1), kChunkElems - 8);
  EXPECT_EQ(chunk_elements_for(kJumboMtu), kChunkElems);
  EXPECT_EQ(chunk_elements_for(9000), kChunkElems);
  EXPECT_EQ(chunk_elements_for(65535), kChunkElems);
  for (uint32_t mtu = kMinLinkMtu; mtu <= 9000; ++mtu) {
    const uint32_t elements = chunk_elements_for(mtu);
    ASSERT_EQ(elements % 8, 0u) << mtu;
    ASSERT_LE(packet_bytes(elements) + kIpUdpBytes, mtu) << mtu;
    if (elements < kChunkElems) {
      ASSERT_GT(packet_bytes(elements + 8) + kIpUdpBytes, mtu) << mtu;
    }
  }
}

TEST(Layout, SmallChunksCountMoreChunksAndExponentChunks) {
  ChunkLayout layout = layout_for(25'000'000, 360);
  EXPECT_EQ(layout.data_chunks, 69445u);  // ceil(25e6 / 360)
  EXPECT_EQ(layout.exponent_chunks, 193u);  // ceil(69445 / 360)
  for (uint32_t chunk_elements : {kMinChunkElems, 360u, 984u, static_cast<uint32_t>(kChunkElems)}) {
    const uint64_t most = max_layout_elements(chunk_elements);
    const ChunkLayout largest = layout_for(most, chunk_elements);
    EXPECT_LE(uint64_t{largest.data_chunks} + largest.exponent_chunks, uint64_t{UINT32_MAX}) << chunk_elements;
  }
}

constexpr uint64_t kN = kChunkElems;
constexpr uint32_t kN32 = static_cast<uint32_t>(kChunkElems);
static_assert(kChunkElems == 2048, "the ResNet-50 case below counts 2048-element chunks");
INSTANTIATE_TEST_SUITE_P(EdgeCases, Layout,
                         ::testing::Values(LayoutCase{0, 0, 0}, LayoutCase{1, 1, 1}, LayoutCase{kN - 1, 1, 1},
                                           LayoutCase{kN, 1, 1}, LayoutCase{kN + 1, 2, 1},
                                           LayoutCase{kN * kN, kN32, 1}, LayoutCase{kN * kN + 1, kN32 + 1, 2},
                                           LayoutCase{25'000'000, 12208, 6}));

}  // namespace
}  // namespace xagg::wire
