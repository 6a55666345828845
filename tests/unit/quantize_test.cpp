#include "xagg/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

#include "wire.h"

namespace xagg::quant {
namespace {

using Chunk = std::vector<float>;

struct Reduced {
  int32_t exponent;
  std::vector<float> values;
};

// What the aggregator and the ranks compute together for one chunk: MAX of
// the local exponents, wrapping int32 SUM of the quantized values, dequantize.
Reduced all_reduce(const std::vector<Chunk>& ranks, double divisor = 1.0) {
  const auto world_size = static_cast<uint32_t>(ranks.size());
  const size_t size = ranks[0].size();
  int32_t exponent = kZeroExponent;
  for (const Chunk& values : ranks) exponent = std::max(exponent, chunk_exponent(values));
  std::vector<uint32_t> sums(wire::kChunkElems, 0);
  std::vector<int32_t> quantized(wire::kChunkElems);
  for (const Chunk& values : ranks) {
    quantize(values, exponent, world_size, quantized);
    for (size_t i = 0; i < quantized.size(); ++i) sums[i] += static_cast<uint32_t>(quantized[i]);
  }
  std::vector<int32_t> signed_sums(sums.begin(), sums.end());
  Reduced reduced{exponent, std::vector<float>(size)};
  dequantize(signed_sums, exponent, world_size, divisor, reduced.values);
  return reduced;
}

double exact_sum(const std::vector<Chunk>& ranks, size_t i) {
  double sum = 0;
  for (const Chunk& values : ranks) sum += values[i];
  return sum;
}

// The bound holds before the final rounding to float, which adds half an ulp.
void expect_within_bound(const std::vector<Chunk>& ranks, const Reduced& reduced) {
  double bound = error_bound(reduced.exponent, static_cast<uint32_t>(ranks.size()));
  for (size_t i = 0; i < reduced.values.size(); ++i) {
    double exact = exact_sum(ranks, i);
    double rounding = std::ldexp(std::fabs(exact) + bound, -24);
    ASSERT_LE(std::fabs(reduced.values[i] - exact), bound + rounding)
        << "element " << i << " of " << ranks.size() << " ranks, exponent " << reduced.exponent;
  }
}

TEST(Quantize, ScaleBitsLeaveRoomForTheSum) {
  EXPECT_EQ(ceil_log2(1), 0);
  EXPECT_EQ(ceil_log2(2), 1);
  EXPECT_EQ(ceil_log2(3), 2);
  EXPECT_EQ(ceil_log2(64), 6);
  EXPECT_EQ(scale_bits(1), 30);
  EXPECT_EQ(scale_bits(33), 24);
  for (uint32_t n = 1; n <= 64; ++n) EXPECT_LE(uint64_t{n} << scale_bits(n), uint64_t{1} << 30);
}

TEST(Quantize, ExponentIsTheFrexpExponentOfTheLargestMagnitude) {
  EXPECT_EQ(chunk_exponent(Chunk{0.5f, -0.25f}), 0);
  EXPECT_EQ(chunk_exponent(Chunk{0.25f, -1.0f}), 1);  // 1 < 2^1
  EXPECT_EQ(chunk_exponent(Chunk{3.0f}), 2);
  EXPECT_EQ(chunk_exponent(Chunk{FLT_MAX}), 128);
  EXPECT_EQ(chunk_exponent(Chunk{std::numeric_limits<float>::denorm_min()}), -148);
  EXPECT_EQ(chunk_exponent(Chunk{0.0f, -0.0f}), kZeroExponent);
  EXPECT_EQ(chunk_exponent(Chunk{}), kZeroExponent);
  EXPECT_EQ(chunk_exponent(Chunk{1.0f, NAN}), kNonFiniteExponent);
  EXPECT_EQ(chunk_exponent(Chunk{NAN, 1.0f}), kNonFiniteExponent);
  EXPECT_EQ(chunk_exponent(Chunk{-INFINITY}), kNonFiniteExponent);
}

TEST(Quantize, ExponentSentinelsOrderUnderSignedMax) {
  // The aggregator combines exponents with a signed int32 MAX.
  EXPECT_EQ(std::max({kZeroExponent, -148, 3}), 3);
  EXPECT_EQ(std::max(kZeroExponent, -148), -148);
  EXPECT_EQ(std::max({kZeroExponent, 128, kNonFiniteExponent}), kNonFiniteExponent);
}

TEST(Quantize, RandomDataStaysWithinTheBoundForEveryWorldSize) {
  std::mt19937 random(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_scale(-30.0f, 30.0f);
  for (uint32_t world_size = 1; world_size <= 64; ++world_size) {
    float scale = std::exp2(log_scale(random));
    std::vector<Chunk> ranks(world_size, Chunk(wire::kChunkElems));
    for (Chunk& values : ranks)
      for (float& value : values) value = normal(random) * scale;
    expect_within_bound(ranks, all_reduce(ranks));
  }
}

TEST(Quantize, BoundIsTightEnoughToBeUseful) {
  // Relative to the largest magnitude, the error is about N^2 * 2^-31.
  EXPECT_DOUBLE_EQ(error_bound(0, 1), std::ldexp(1.0, -31));
  EXPECT_DOUBLE_EQ(error_bound(0, 64), 64 * std::ldexp(1.0, -25));
  EXPECT_DOUBLE_EQ(error_bound(kZeroExponent, 8), 0.0);
  EXPECT_TRUE(std::isinf(error_bound(kNonFiniteExponent, 8)));
}

TEST(Quantize, ExtremeValuesDoNotOverflowWith64Ranks) {
  std::vector<Chunk> ranks(64, Chunk{FLT_MAX, -FLT_MAX, FLT_MAX / 2, 0.0f});
  Reduced average = all_reduce(ranks, 64.0);
  EXPECT_EQ(average.exponent, 128);
  EXPECT_EQ(average.values[0], FLT_MAX);
  EXPECT_EQ(average.values[1], -FLT_MAX);
  // Half of FLT_MAX has more significant bits than S = 24 keeps.
  EXPECT_NEAR(average.values[2], FLT_MAX / 2, error_bound(128, 64) / 64);
  EXPECT_EQ(average.values[3], 0.0f);
  // The sum itself exceeds float's range: it saturates to infinity, with the sign.
  Reduced sum = all_reduce(ranks);
  EXPECT_EQ(sum.values[0], INFINITY);
  EXPECT_EQ(sum.values[1], -INFINITY);
}

TEST(Quantize, OppositeExtremesCancel) {
  std::vector<Chunk> ranks{Chunk{FLT_MAX, -FLT_MAX}, Chunk{-FLT_MAX, FLT_MAX}};
  Reduced sum = all_reduce(ranks);
  EXPECT_EQ(sum.values[0], 0.0f);
  EXPECT_EQ(sum.values[1], 0.0f);
}

TEST(Quantize, ZeroChunksGiveZeros) {
  std::vector<Chunk> ranks(5, Chunk(wire::kChunkElems, 0.0f));
  Reduced sum = all_reduce(ranks);
  EXPECT_EQ(sum.exponent, kZeroExponent);
  for (float value : sum.values) EXPECT_EQ(value, 0.0f);
}

TEST(Quantize, AllZeroRankJoinsAnotherRanksExponent) {
  std::vector<Chunk> ranks{Chunk{0.0f, 0.0f}, Chunk{1.5f, -0.75f}, Chunk{0.0f, 0.0f}};
  Reduced sum = all_reduce(ranks);
  EXPECT_EQ(sum.exponent, 1);
  EXPECT_EQ(sum.values[0], 1.5f);
  EXPECT_EQ(sum.values[1], -0.75f);
}

TEST(Quantize, DenormalsAreExact) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  std::vector<Chunk> ranks{Chunk{tiny, 3 * tiny, -tiny}, Chunk{tiny, 0.0f, -2 * tiny}};
  Reduced sum = all_reduce(ranks);
  EXPECT_EQ(sum.values[0], 2 * tiny);
  EXPECT_EQ(sum.values[1], 3 * tiny);
  EXPECT_EQ(sum.values[2], -3 * tiny);
  EXPECT_EQ(all_reduce(ranks, 2.0).values[0], tiny);
}

TEST(Quantize, MixedMagnitudesLoseOnlyTheSmallOnes) {
  // Values far below the chunk's largest fall under one quantization step.
  std::vector<Chunk> ranks{Chunk{1e6f, 1e-6f, -3.0f, 1e-30f}, Chunk{-2e5f, 2e-6f, 7.0f, 0.0f}};
  Reduced sum = all_reduce(ranks);
  expect_within_bound(ranks, sum);
  EXPECT_FLOAT_EQ(sum.values[0], 8e5f);
  EXPECT_FLOAT_EQ(sum.values[2], 4.0f);
  EXPECT_EQ(sum.values[3], 0.0f);
}

// A chunk with NaN or Inf on any rank gets the sentinel (and then its own
// path, tested in communicator_test.cpp), which needs the exponent of the
// finite values alone.
TEST(Quantize, NonFiniteChunkHasTheSentinelAndAFiniteExponent) {
  std::vector<Chunk> ranks{Chunk{1.0f, 2.0f}, Chunk{INFINITY, 1.0f}, Chunk{0.0f, 0.0f}};
  EXPECT_EQ(all_reduce(ranks).exponent, kNonFiniteExponent);
  EXPECT_EQ(finite_exponent(Chunk{INFINITY, 3.0f, NAN, -0.5f}), 2);
  EXPECT_EQ(finite_exponent(Chunk{-INFINITY, NAN}), kZeroExponent);
  EXPECT_EQ(finite_exponent(Chunk{-FLT_MAX, NAN}), 128);
}

TEST(Quantize, PartialChunkIsZeroPadded) {
  std::vector<int32_t> out(wire::kChunkElems, -1);
  quantize(Chunk{0.5f, -0.5f}, 0, 1, out);
  EXPECT_EQ(out[0], 1 << 29);
  EXPECT_EQ(out[1], -(1 << 29));
  for (size_t i = 2; i < out.size(); ++i) ASSERT_EQ(out[i], 0) << i;
}

TEST(Quantize, LargestMagnitudeQuantizesWithinScaleBits) {
  // x just below 2^e maps to at most 2^S.
  std::vector<int32_t> out(1);
  float below_two = std::nextafter(2.0f, 0.0f);
  quantize(Chunk{below_two}, 1, 64, out);
  EXPECT_LE(out[0], 1 << scale_bits(64));
  quantize(Chunk{-below_two}, 1, 64, out);
  EXPECT_GE(out[0], -(1 << scale_bits(64)));
}

TEST(Quantize, PredictionsComeOnlyFromMagnitudes) {
  EXPECT_EQ(predicted_exponent(5), 5 + kPredictionMargin);
  EXPECT_EQ(predicted_exponent(-140), -140 + kPredictionMargin);
  EXPECT_FALSE(predicted_exponent(kZeroExponent));
  EXPECT_FALSE(predicted_exponent(kNonFiniteExponent));
}

TEST(Quantize, APredictionHoldsWithoutOverflowAndWithBoundedPrecisionLoss) {
  EXPECT_TRUE(prediction_holds(6, 6));
  EXPECT_TRUE(prediction_holds(6, 6 - kMaxExponentExcess));
  EXPECT_FALSE(prediction_holds(6, 6 - kMaxExponentExcess - 1));  // too coarse
  EXPECT_FALSE(prediction_holds(6, 7));                           // would overflow
  EXPECT_TRUE(prediction_holds(6, kZeroExponent));                // zeros are exact at any scale
  EXPECT_FALSE(prediction_holds(6, kNonFiniteExponent));
}

// Quantized with an exponent above the common one (a prediction that held),
// the result keeps to the bound of that exponent.
TEST(Quantize, AHeldPredictionKeepsToItsBound) {
  std::mt19937 random(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  constexpr uint32_t kRanks = 4;
  std::vector<Chunk> ranks(kRanks, Chunk(wire::kChunkElems));
  for (Chunk& values : ranks) std::ranges::generate(values, [&] { return uniform(random); });
  int32_t common = kZeroExponent;
  for (const Chunk& values : ranks) common = std::max(common, chunk_exponent(values));
  const int32_t used = common + kMaxExponentExcess;
  ASSERT_TRUE(prediction_holds(used, common));
  std::vector<int32_t> sums(wire::kChunkElems, 0), quantized(wire::kChunkElems);
  for (const Chunk& values : ranks) {
    quantize(values, used, kRanks, quantized);
    for (size_t i = 0; i < sums.size(); ++i) sums[i] += quantized[i];
  }
  std::vector<float> result(wire::kChunkElems);
  dequantize(sums, used, kRanks, 1.0, result);
  const double bound = error_bound(used, kRanks);
  for (size_t i = 0; i < result.size(); ++i) {
    double exact = exact_sum(ranks, i);
    ASSERT_LE(std::fabs(result[i] - exact), bound + std::ldexp(std::fabs(exact) + bound, -24)) << "element " << i;
  }
}

}  // namespace
}  // namespace xagg::quant
