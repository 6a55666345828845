// libxagg against the protocol's test vectors (tests/vectors/protocol_v9.json),
// which tests/vectors/make_vectors.py writes from docs/protocol.md alone: the
// packets' bytes both ways, the join exchange, and float32 exponents and
// quantized values.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "admission.h"
#include "control_messages.h"
#include "wire.h"
#include "xagg/quantize.h"

namespace xagg {
namespace {

using nlohmann::json;

const json& vectors() {
  static const json loaded = json::parse(std::ifstream(XAGG_VECTORS_FILE));
  return loaded;
}

std::vector<std::byte> from_hex(const std::string& hex) {
  std::vector<std::byte> bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) bytes.push_back(std::byte(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return bytes;
}

std::string to_hex(const std::vector<std::byte>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (std::byte byte : bytes) {
    hex += kDigits[std::to_integer<int>(byte) >> 4];
    hex += kDigits[std::to_integer<int>(byte) & 15];
  }
  return hex;
}

TEST(ProtocolVectors, AreOfThisVersion) {
  EXPECT_EQ(vectors().at("version").get<int>(), XAGG_VERSION);
  EXPECT_EQ(vectors().at("version").get<int>(), control::kProtocolVersion);
}

// One packet vector: its fields and payload (int32 elements, or 16-bit lanes
// with flag NARROW) encode to its bytes, which decode back to them.
void expect_packet_matches(const json& vector) {
  SCOPED_TRACE(vector.at("name").get<std::string>());
  const json& fields = vector.at("fields");
  wire::Header header{static_cast<wire::MsgType>(fields.at("kind").get<int>()),
                      fields.at("job").get<uint32_t>(),
                      fields.at("token").get<uint64_t>(),
                      fields.at("iteration").get<uint32_t>(),
                      fields.at("chunk").get<uint32_t>(),
                      fields.at("rank").get<uint16_t>(),
                      static_cast<wire::ElemOp>(fields.at("op").get<int>()),
                      fields.at("flags").get<uint8_t>(),
                      fields.at("total").get<uint32_t>()};
  const bool narrow = (header.flags & wire::kFlagNarrow) != 0;
  const auto payload = vector.at("payload").get<std::vector<int32_t>>();
  std::vector<std::byte> encoded(wire::packet_bytes(payload.size(), narrow));
  wire::encode_header(header, encoded);
  if (narrow)
    wire::narrow_lanes(payload, wire::narrow_payload(encoded.data()));
  else
    std::memcpy(encoded.data() + wire::kHeaderBytes, payload.data(), payload.size() * sizeof(int32_t));
  EXPECT_EQ(to_hex(encoded), vector.at("hex").get<std::string>());

  const std::vector<std::byte> bytes = from_hex(vector.at("hex").get<std::string>());
  wire::Decoded decoded = wire::decode_packet(bytes);
  ASSERT_TRUE(decoded.header) << wire::to_string(decoded.error);
  EXPECT_TRUE(*decoded.header == header);
  EXPECT_EQ(decoded.narrow(), narrow);
  ASSERT_EQ(decoded.elements, payload.size());
  std::vector<int32_t> values(decoded.elements);
  if (narrow)
    wire::widen_lanes(wire::narrow_payload(bytes.data()), values);
  else
    std::memcpy(values.data(), wire::payload(bytes.data()), values.size() * sizeof(int32_t));
  EXPECT_EQ(values, payload);
}

TEST(ProtocolVectors, PacketsEncodeAndDecodeToTheirBytes) {
  for (const json& vector : vectors().at("packets")) expect_packet_matches(vector);
}

TEST(ProtocolVectors, JoinExchangeDecodesAndTheJobTakesTheSmallestMtu) {
  const json& join = vectors().at("join");
  uint32_t mtu = UINT32_MAX;
  uint64_t elements = 0;
  for (const json& text : join.at("requests")) {
    auto request = std::get<control::JoinRequest>(control::decode(text.dump()));
    EXPECT_EQ(request.job_id, text.at("job").get<uint32_t>());
    EXPECT_EQ(request.world_size, text.at("world_size").get<uint32_t>());
    EXPECT_EQ(request.mtu, text.at("mtu").get<uint32_t>());
    mtu = std::min(mtu, request.mtu);
    elements = request.elements;
  }
  auto reply = std::get<control::JoinReply>(control::decode(join.at("reply").dump()));
  EXPECT_EQ(reply.token, 0x0123456789abcdefull);
  auto start = std::get<control::Start>(control::decode(join.at("start").dump()));
  EXPECT_EQ(start.mtu, mtu);
  EXPECT_EQ(start.chunk_elements, wire::chunk_elements_for(mtu));
  EXPECT_EQ(start.chunks, wire::layout_for(elements, start.chunk_elements).total());
  EXPECT_EQ(start.results, wire::ResultMode::Broadcast);
  auto multicast = std::get<control::Start>(control::decode(join.at("start_multicast").dump()));
  EXPECT_EQ(multicast.results, wire::ResultMode::Multicast);
  EXPECT_EQ(multicast.group, "239.18.0.5");
  EXPECT_EQ(std::get<control::Start>(control::decode(join.at("start_unicast").dump())).results,
            wire::ResultMode::Unicast);
  // What libxagg writes decodes to the same message.
  EXPECT_EQ(std::get<control::Start>(control::decode(control::encode(multicast))), multicast);
}

TEST(ProtocolVectors, LayoutsMatchTheChunkSizeForEachMtu) {
  for (const json& expected : vectors().at("layouts")) {
    const uint32_t chunk_elements = wire::chunk_elements_for(expected.at("mtu").get<uint32_t>());
    EXPECT_EQ(chunk_elements, expected.at("chunk_elements").get<uint32_t>()) << expected.dump();
    const wire::ChunkLayout layout = wire::layout_for(expected.at("elements").get<uint64_t>(), chunk_elements);
    EXPECT_EQ(layout.data_chunks, expected.at("data_chunks").get<uint32_t>()) << expected.dump();
    EXPECT_EQ(layout.exponent_chunks, expected.at("exponent_chunks").get<uint32_t>()) << expected.dump();
  }
}

TEST(ProtocolVectors, AdmissionProofMatchesTheChallengedJoin) {
  const json& admission = vectors().at("admission");
  auto challenge = std::get<control::Challenge>(control::decode(admission.at("challenge").dump()));
  auto request = std::get<control::JoinRequest>(control::decode(admission.at("request").dump()));
  const std::string secret = admission.at("secret");
  EXPECT_EQ(join_proof(secret, challenge.nonce, request.job_id, request.rank, request.world_size), request.auth);
  EXPECT_TRUE(proof_matches(request.auth, join_proof(secret, challenge.nonce, request.job_id, request.rank,
                                                     request.world_size)));
  EXPECT_FALSE(proof_matches(request.auth, join_proof(secret + "x", challenge.nonce, request.job_id, request.rank,
                                                      request.world_size)));
  EXPECT_FALSE(proof_matches(request.auth, join_proof(secret, challenge.nonce, request.job_id, request.rank + 1,
                                                      request.world_size)));
  EXPECT_EQ(control::encode(request), admission.at("request").dump());
}

TEST(ProtocolVectors, Float32ExponentsAndQuantizedValues) {
  for (const json& vector : vectors().at("quantization")) {
    SCOPED_TRACE(vector.at("name").get<std::string>());
    std::vector<float> values;
    for (const json& bits : vector.at("values")) {
      std::vector<std::byte> bytes = from_hex(bits.get<std::string>());
      uint32_t word = 0;
      std::memcpy(&word, bytes.data(), sizeof(word));  // little-endian, as written
      values.push_back(std::bit_cast<float>(word));
    }
    const auto world_size = vector.at("world_size").get<uint32_t>();
    const auto exponent = vector.at("exponent").get<int32_t>();
    EXPECT_EQ(quant::chunk_exponent(values), exponent);
    std::vector<int32_t> quantized(values.size());
    if (exponent == quant::kNonFiniteExponent) {  // section 5.4: the finite values go with their own exponent
      const auto finite_exponent = vector.at("finite_exponent").get<int32_t>();
      EXPECT_EQ(quant::finite_exponent(values), finite_exponent);
      std::ranges::replace_if(values, [](float x) { return !std::isfinite(x); }, 0.0f);
      quant::quantize(values, finite_exponent, world_size, quantized);
      EXPECT_EQ(quantized, vector.at("finite_quantized").get<std::vector<int32_t>>());
      continue;
    }
    quant::quantize(values, exponent, world_size, quantized);
    EXPECT_EQ(quantized, vector.at("quantized").get<std::vector<int32_t>>());
  }
}

// Section 5.3: the prediction from a remembered exponent, and whether it holds
// for the common exponent (else the chunk is redone with the common one).
TEST(ProtocolVectors, PredictedExponentsHoldOrRedo) {
  for (const json& vector : vectors().at("prediction")) {
    SCOPED_TRACE(vector.dump());
    const std::optional<int32_t> predicted = quant::predicted_exponent(vector.at("remembered").get<int32_t>());
    if (vector.at("predicted").is_null()) {
      EXPECT_FALSE(predicted.has_value());
      continue;
    }
    ASSERT_TRUE(predicted.has_value());
    EXPECT_EQ(*predicted, vector.at("predicted").get<int32_t>());
    const auto common = vector.at("common").get<int32_t>();
    const bool holds = quant::prediction_holds(*predicted, common);
    EXPECT_EQ(holds, vector.at("holds").get<bool>());
    EXPECT_EQ(holds ? *predicted : common, vector.at("values_use").get<int32_t>());
    EXPECT_EQ(!holds, vector.at("redo").get<bool>());
  }
}

// Section 11: the 16-bit wire's join and start, packets, the aggregator's
// rescaling, and float32 chunks through the whole path.
TEST(ProtocolVectors, Wire16JoinAndStart) {
  const json& wire16 = vectors().at("wire16");
  auto request = std::get<control::JoinRequest>(control::decode(wire16.at("join").dump()));
  EXPECT_EQ(request.wire_bits, wire::kNarrowBits);
  EXPECT_EQ(control::encode(request), wire16.at("join").dump());
  auto start = std::get<control::Start>(control::decode(wire16.at("start").dump()));
  EXPECT_EQ(start.wire_bits, wire::kNarrowBits);
  EXPECT_EQ(start.chunk_elements, wire::chunk_elements_for(request.mtu, wire::kNarrowBits));
  EXPECT_EQ(start.chunks, wire::layout_for(request.elements, start.chunk_elements).total());
  EXPECT_EQ(control::encode(start), wire16.at("start").dump());
}

TEST(ProtocolVectors, Wire16PacketsEncodeAndDecodeToTheirBytes) {
  for (const json& vector : vectors().at("wire16").at("packets")) expect_packet_matches(vector);
}

TEST(ProtocolVectors, Wire16RescalingRoundsTiesToEven) {
  for (const json& vector : vectors().at("wire16").at("rescale"))
    EXPECT_EQ(wire::rescale_sum(vector.at("sum").get<int32_t>(), vector.at("shift").get<uint32_t>()),
              vector.at("result").get<int32_t>())
        << vector.dump();
}

float float_of_hex(const std::string& hex) {
  std::vector<std::byte> bytes = from_hex(hex);
  uint32_t word = 0;
  std::memcpy(&word, bytes.data(), sizeof(word));  // little-endian, as written
  return std::bit_cast<float>(word);
}

TEST(ProtocolVectors, Wire16ChunksThroughTheWholePath) {
  for (const json& vector : vectors().at("wire16").at("chunks")) {
    SCOPED_TRACE(vector.at("name").get<std::string>());
    const auto exponent = vector.at("exponent").get<int32_t>();
    const auto expected_lanes = vector.at("lanes").get<std::vector<std::vector<int32_t>>>();
    int32_t common = quant::kZeroExponent;
    std::vector<int32_t> sums;
    for (size_t rank = 0; rank < vector.at("values").size(); ++rank) {
      std::vector<float> values;
      for (const json& bits : vector.at("values")[rank]) values.push_back(float_of_hex(bits.get<std::string>()));
      common = std::max(common, quant::chunk_exponent(values));
      std::vector<int32_t> lanes(values.size());
      quant::quantize(values, exponent, quant::Scale{quant::kNarrowValueBits, 0}, lanes);
      EXPECT_EQ(lanes, expected_lanes[rank]);
      sums.resize(lanes.size());
      for (size_t i = 0; i < lanes.size(); ++i) sums[i] += lanes[i];
    }
    EXPECT_EQ(common, exponent);
    EXPECT_EQ(sums, vector.at("sums").get<std::vector<int32_t>>());
    const auto shift = vector.at("sum_shift").get<uint32_t>();
    EXPECT_EQ(static_cast<uint32_t>(quant::narrow_sum_shift(vector.at("world_size").get<uint32_t>(), 0)), shift);
    std::vector<int32_t> result_lanes;
    for (int32_t sum : sums) result_lanes.push_back(wire::rescale_sum(sum, shift));
    EXPECT_EQ(result_lanes, vector.at("result_lanes").get<std::vector<int32_t>>());
    std::vector<float> result(result_lanes.size());
    quant::dequantize(result_lanes, exponent, quant::Scale{quant::kNarrowValueBits, static_cast<int>(shift)}, 1.0,
                      result);
    for (size_t i = 0; i < result.size(); ++i)
      EXPECT_EQ(std::bit_cast<uint32_t>(result[i]),
                std::bit_cast<uint32_t>(float_of_hex(vector.at("result")[i].get<std::string>())))
          << "element " << i;
  }
}

}  // namespace
}  // namespace xagg
