#include "xagg/quantize.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace xagg::quant {
namespace {

// Adding and subtracting 1.5 * 2^52 rounds a double of magnitude < 2^51 to
// the nearest integer (ties to even) without a branch or a libm call, so the
// quantization loop vectorizes with plain SSE2.
constexpr double kRoundingShift = 0x1.8p52;

// Magnitudes compared as integers: with the sign bit cleared, IEEE floats
// order like their bit patterns, and NaN and Inf sort above every finite
// value. One integer max reduction vectorizes; a float max with NaN does not.
constexpr int32_t kMagnitudeMask = 0x7fffffff;
constexpr int32_t kInfinityBits = 0x7f800000;

int32_t magnitude_bits(float value) { return std::bit_cast<int32_t>(value) & kMagnitudeMask; }

int32_t exponent_of_largest(int32_t largest_bits) {
  if (largest_bits == 0) return kZeroExponent;
  int exponent = 0;
  std::frexp(std::bit_cast<float>(largest_bits), &exponent);
  return exponent;
}

}  // namespace

int ceil_log2(uint32_t world_size) { return std::bit_width(world_size - 1); }

int scale_bits(uint32_t world_size) { return 30 - ceil_log2(world_size); }

int32_t chunk_exponent(std::span<const float> values) {
  int32_t largest_bits = 0;
  for (float value : values) largest_bits = std::max(largest_bits, magnitude_bits(value));
  return largest_bits >= kInfinityBits ? kNonFiniteExponent : exponent_of_largest(largest_bits);
}

int32_t finite_exponent(std::span<const float> values) {
  int32_t largest_bits = 0;
  for (float value : values) {
    int32_t bits = magnitude_bits(value);
    largest_bits = std::max(largest_bits, bits < kInfinityBits ? bits : 0);
  }
  return exponent_of_largest(largest_bits);
}

Scale wide_scale(uint32_t world_size) { return {scale_bits(world_size), 0}; }

void quantize(std::span<const float> values, int32_t exponent, uint32_t world_size, std::span<int32_t> out) {
  quantize(values, exponent, wide_scale(world_size), out);
}

void dequantize(std::span<const int32_t> sums, int32_t exponent, uint32_t world_size, double divisor,
                std::span<float> out) {
  dequantize(sums, exponent, wide_scale(world_size), divisor, out);
}

void quantize(std::span<const float> values, int32_t exponent, Scale scale, std::span<int32_t> out) {
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(values.size()), out.end(), 0);
  if (exponent == kZeroExponent || exponent == kNonFiniteExponent) {
    std::fill_n(out.begin(), values.size(), 0);
    return;
  }
  // In double: 2^(S - e) reaches 2^178 for denormals, beyond float's range.
  const double factor = std::ldexp(1.0, scale.value_bits - exponent);
  const float* in = values.data();
  int32_t* quantized = out.data();
  for (size_t i = 0; i < values.size(); ++i) {
    double scaled = static_cast<double>(in[i]) * factor;
    quantized[i] = static_cast<int32_t>((scaled + kRoundingShift) - kRoundingShift);
  }
}

void dequantize(std::span<const int32_t> sums, int32_t exponent, Scale scale, double divisor, std::span<float> out) {
  if (exponent == kZeroExponent || exponent == kNonFiniteExponent) {
    std::fill(out.begin(), out.end(), exponent == kZeroExponent ? 0.0f : std::numeric_limits<float>::quiet_NaN());
    return;
  }
  const double factor = std::ldexp(1.0, exponent - scale.value_bits + scale.sum_shift) / divisor;
  const int32_t* in = sums.data();
  float* result = out.data();
  for (size_t i = 0; i < out.size(); ++i) result[i] = static_cast<float>(static_cast<double>(in[i]) * factor);
}

int32_t exponent_of_lane(int32_t lane) {
  if (lane == std::numeric_limits<int16_t>::min()) return kZeroExponent;
  if (lane == std::numeric_limits<int16_t>::max()) return kNonFiniteExponent;
  return lane;
}

int narrow_sum_shift(uint32_t world_size, uint32_t ranks_per_leaf) {
  if (ranks_per_leaf == 0) return ceil_log2(world_size);
  return ceil_log2(ranks_per_leaf) + ceil_log2((world_size + ranks_per_leaf - 1) / ranks_per_leaf);
}

double narrow_error_bound(int32_t exponent, uint32_t world_size, uint32_t ranks_per_leaf) {
  if (exponent == kZeroExponent) return 0.0;
  if (exponent == kNonFiniteExponent) return std::numeric_limits<double>::infinity();
  const double half_step = std::ldexp(1.0, exponent - kNarrowValueBits - 1);
  double steps = world_size + std::ldexp(1.0, narrow_sum_shift(world_size, ranks_per_leaf));
  if (ranks_per_leaf != 0)
    steps += static_cast<double>((world_size + ranks_per_leaf - 1) / ranks_per_leaf) *
             std::ldexp(1.0, ceil_log2(ranks_per_leaf));
  return half_step * steps;
}

double error_bound(int exponent, uint32_t world_size) {
  if (exponent == kZeroExponent) return 0.0;
  if (exponent == kNonFiniteExponent) return std::numeric_limits<double>::infinity();
  return world_size * std::ldexp(1.0, exponent - 31 + ceil_log2(world_size));
}

std::optional<int32_t> predicted_exponent(int32_t previous) {
  if (previous == kZeroExponent || previous == kNonFiniteExponent) return std::nullopt;
  return previous + kPredictionMargin;
}

bool prediction_holds(int32_t predicted, int32_t common) {
  if (common == kZeroExponent) return true;
  return common <= predicted && predicted - common <= kMaxExponentExcess;
}

}  // namespace xagg::quant
