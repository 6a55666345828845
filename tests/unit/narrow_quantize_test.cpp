// The 16-bit wire's quantization (docs/protocol.md section 11) against a
// float64 reference, every element against its bound: each rank's lanes, the
// aggregators' rescaling (one level, or every leaf and the root), the
// dequantized result. Beside it, for the record, what float16 accumulation
// (Gloo's float16 all-reduce) gives on the same inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "wire.h"
#include "xagg/quantize.h"

namespace xagg::quant {
namespace {

using Chunk = std::vector<float>;

// What ranks_per_leaf leaves (0: one aggregator) and the ranks compute for one
// chunk on the 16-bit wire with the common exponent `exponent`.
std::vector<float> narrow_all_reduce(const std::vector<Chunk>& ranks, int32_t exponent, uint32_t ranks_per_leaf) {
  const auto world_size = static_cast<uint32_t>(ranks.size());
  const size_t size = ranks[0].size();
  const uint32_t leaf_size = ranks_per_leaf == 0 ? world_size : ranks_per_leaf;
  const uint32_t leaves = (world_size + leaf_size - 1) / leaf_size;
  const auto leaf_shift = static_cast<uint32_t>(ceil_log2(leaf_size));
  std::vector<int32_t> root(size, 0), lanes(size);
  for (uint32_t leaf = 0; leaf < leaves; ++leaf) {
    std::vector<int32_t> cell(size, 0);
    for (uint32_t rank = leaf * leaf_size; rank < std::min(world_size, (leaf + 1) * leaf_size); ++rank) {
      quantize(ranks[rank], exponent, Scale{kNarrowValueBits, 0}, lanes);
      for (size_t i = 0; i < size; ++i) {
        EXPECT_LE(std::abs(lanes[i]), 1 << kNarrowValueBits);  // fits an int16 lane
        cell[i] += lanes[i];
      }
    }
    for (size_t i = 0; i < size; ++i) {
      const int32_t share = wire::rescale_sum(cell[i], leaf_shift);
      EXPECT_TRUE(share >= INT16_MIN && share <= INT16_MAX);
      root[i] += share;
    }
  }
  const auto shift = static_cast<uint32_t>(narrow_sum_shift(world_size, ranks_per_leaf));
  if (ranks_per_leaf != 0)
    for (int32_t& sum : root) sum = wire::rescale_sum(sum, shift - leaf_shift);
  std::vector<float> result(size);
  dequantize(root, exponent, Scale{kNarrowValueBits, static_cast<int>(shift)}, 1.0, result);
  return result;
}

int32_t common_exponent(const std::vector<Chunk>& ranks) {
  int32_t exponent = kZeroExponent;
  for (const Chunk& values : ranks) exponent = std::max(exponent, chunk_exponent(values));
  return exponent;
}

double exact_sum(const std::vector<Chunk>& ranks, size_t i) {
  double sum = 0;
  for (const Chunk& values : ranks) sum += values[i];
  return sum;
}

std::vector<Chunk> random_ranks(uint32_t world_size, size_t size, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<Chunk> ranks(world_size, Chunk(size));
  for (Chunk& chunk : ranks) std::ranges::generate(chunk, [&] { return normal(rng); });
  return ranks;
}

// Every element within narrow_error_bound of the float64 sum, plus the final
// rounding to float32; the bound for a prediction's exponent too.
void expect_within_bound(const std::vector<Chunk>& ranks, uint32_t ranks_per_leaf, int extra_exponent = 0) {
  const int32_t exponent = common_exponent(ranks) + extra_exponent;
  const auto world_size = static_cast<uint32_t>(ranks.size());
  const std::vector<float> result = narrow_all_reduce(ranks, exponent, ranks_per_leaf);
  const double bound = narrow_error_bound(exponent, world_size, ranks_per_leaf);
  for (size_t i = 0; i < result.size(); ++i) {
    const double exact = exact_sum(ranks, i);
    ASSERT_LE(std::fabs(result[i] - exact), bound + std::ldexp(std::fabs(exact) + bound, -24))
        << "element " << i << " of " << world_size << " ranks in leaves of " << ranks_per_leaf << ", exponent "
        << exponent;
  }
}

TEST(NarrowQuantize, ChunkSizeDoublesWithinTheSameBytes) {
  for (uint32_t mtu : {1280u, 1500u, 4000u, 9000u}) {
    EXPECT_EQ(wire::chunk_elements_for(mtu, wire::kNarrowBits), 2 * wire::chunk_elements_for(mtu));
    EXPECT_EQ(wire::packet_bytes(wire::chunk_elements_for(mtu, wire::kNarrowBits), true),
              wire::packet_bytes(wire::chunk_elements_for(mtu)));
  }
  EXPECT_EQ(wire::chunk_elements_for(9000, wire::kNarrowBits), wire::kMaxChunkElems);
}

TEST(NarrowQuantize, SumShiftFollowsTheLevels) {
  EXPECT_EQ(narrow_sum_shift(1, 0), 0);
  EXPECT_EQ(narrow_sum_shift(4, 0), 2);
  EXPECT_EQ(narrow_sum_shift(5, 0), 3);
  EXPECT_EQ(narrow_sum_shift(64, 0), 6);
  EXPECT_EQ(narrow_sum_shift(72, 24), 5 + 2);    // leaves of 24, 3 leaves
  EXPECT_EQ(narrow_sum_shift(33, 32), 5 + 1);    // a last leaf of one rank sums on the same scale
  EXPECT_EQ(narrow_sum_shift(4096, 64), 6 + 6);
}

TEST(NarrowQuantize, RandomDataStaysWithinTheBoundForEveryWorldSize) {
  std::mt19937 rng(31);
  for (uint32_t world_size : {1u, 2u, 3u, 4u, 7u, 16u, 33u, 64u})
    for (float scale : {1e-30f, 1e-3f, 1.0f, 3e4f})
      expect_within_bound(random_ranks(world_size, 720, scale, rng), 0);
}

TEST(NarrowQuantize, TwoLevelsStayWithinTheirBound) {
  std::mt19937 rng(32);
  for (auto [world_size, per_leaf] : {std::pair{72u, 24u}, std::pair{33u, 32u}, std::pair{130u, 64u}, std::pair{8u, 3u}})
    expect_within_bound(random_ranks(world_size, 360, 0.5f, rng), per_leaf);
}

// A held prediction (up to kMaxExponentExcess above the common exponent) keeps its own bound.
TEST(NarrowQuantize, APredictedExponentKeepsItsBound) {
  std::mt19937 rng(33);
  for (int extra = 1; extra <= kMaxExponentExcess; ++extra) expect_within_bound(random_ranks(4, 720, 2.0f, rng), 0, extra);
}

// Extremes: every rank at the chunk's largest magnitude, both signs, 64 ranks: lanes at +-2^14, no overflow.
TEST(NarrowQuantize, ExtremesOf64RanksNeitherOverflowNorClip) {
  const float largest = std::nextafter(1.0f, 0.0f);  // just below 2^0: lanes round to 2^14
  std::vector<Chunk> ranks(64, Chunk{largest, -largest, 0.0f, largest});
  expect_within_bound(ranks, 0);
  expect_within_bound(std::vector<Chunk>(4096 / 64 * 2, Chunk{largest, -largest}), 64);
}

TEST(NarrowQuantize, ExponentLanesCarryTheSentinelsAsInt16Extremes) {
  std::vector<int32_t> exponents{kZeroExponent, kNonFiniteExponent, -149, 128, 0};
  std::vector<int16_t> lanes(exponents.size());
  wire::narrow_lanes(exponents, lanes.data());
  std::vector<int32_t> widened(exponents.size());
  wire::widen_lanes(lanes.data(), widened);
  for (size_t i = 0; i < exponents.size(); ++i) EXPECT_EQ(exponent_of_lane(widened[i]), exponents[i]);
}

// float16 addition as Gloo's float16 all-reduce does it: each partial sum rounded to float16.
double float16_ring_sum(const std::vector<Chunk>& ranks, size_t i) {
  _Float16 sum = static_cast<_Float16>(ranks[0][i]);
  for (size_t r = 1; r < ranks.size(); ++r) sum = static_cast<_Float16>(sum + static_cast<_Float16>(ranks[r][i]));
  return static_cast<double>(sum);
}

// The comparison docs/protocol.md section 11 reports: the largest error
// relative to the chunk's largest input over all elements, and relative to
// the sum of the inputs' magnitudes over the elements 2^-10 below the others,
// for XAgg's 16-bit wire and for float16 sums.
TEST(NarrowQuantize, ComparedWithFloat16Accumulation) {
  std::mt19937 rng(34);
  std::printf("%6s %22s %22s %24s %24s\n", "ranks", "xagg16 max err/max|x|", "fp16 max err/max|x|",
              "xagg16 small err/sum|x|", "fp16 small err/sum|x|");
  for (uint32_t world_size : {4u, 16u, 64u}) {
    std::vector<Chunk> ranks = random_ranks(world_size, 4096, 1.0f, rng);
    for (Chunk& chunk : ranks)  // a quarter of the elements 2^-10 smaller: gradients' spread
      for (size_t i = 0; i < chunk.size(); i += 4) chunk[i] *= 0x1p-10f;
    const int32_t exponent = common_exponent(ranks);
    const std::vector<float> result = narrow_all_reduce(ranks, exponent, 0);
    double largest = 0;
    for (const Chunk& chunk : ranks)
      for (float value : chunk) largest = std::max(largest, double(std::fabs(value)));
    double xagg = 0, fp16 = 0, xagg_small = 0, fp16_small = 0;
    for (size_t i = 0; i < result.size(); ++i) {
      const double exact = exact_sum(ranks, i);
      const double xagg_error = std::fabs(result[i] - exact), fp16_error = std::fabs(float16_ring_sum(ranks, i) - exact);
      xagg = std::max(xagg, xagg_error / largest);
      fp16 = std::max(fp16, fp16_error / largest);
      if (i % 4 == 0) {  // relative to the inputs' magnitudes, which a cancelling sum does not show
        double magnitude = 0;
        for (const Chunk& chunk : ranks) magnitude += std::fabs(chunk[i]);
        xagg_small = std::max(xagg_small, xagg_error / magnitude);
        fp16_small = std::max(fp16_small, fp16_error / magnitude);
      }
    }
    std::printf("%6u %22.3e %22.3e %24.3e %24.3e\n", world_size, xagg, fp16, xagg_small, fp16_small);
    EXPECT_LE(xagg * largest, narrow_error_bound(exponent, world_size, 0) + std::ldexp(largest * world_size, -24));
  }
}

}  // namespace
}  // namespace xagg::quant
