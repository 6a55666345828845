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

void quantize(std::span<const float> values, int32_t exponent, uint32_t world_size, std::span<int32_t> out) {
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(values.size()), out.end(), 0);
  if (exponent == kZeroExponent || exponent == kNonFiniteExponent) {
    std::fill_n(out.begin(), values.size(), 0);
    return;
  }
  // In double: 2^(S - e) reaches 2^178 for denormals, beyond float's range.
  const double scale = std::ldexp(1.0, scale_bits(world_size) - exponent);
  const float* in = values.data();
  int32_t* quantized = out.data();
  for (size_t i = 0; i < values.size(); ++i) {
    double scaled = static_cast<double>(in[i]) * scale;
    quantized[i] = static_cast<int32_t>((scaled + kRoundingShift) - kRoundingShift);
  }
}

void dequantize(std::span<const int32_t> sums, int32_t exponent, uint32_t world_size, double divisor,
                std::span<float> out) {
  if (exponent == kZeroExponent || exponent == kNonFiniteExponent) {
    std::fill(out.begin(), out.end(), exponent == kZeroExponent ? 0.0f : std::numeric_limits<float>::quiet_NaN());
    return;
  }
  const double scale = std::ldexp(1.0, exponent - scale_bits(world_size)) / divisor;
  const int32_t* in = sums.data();
  float* result = out.data();
  for (size_t i = 0; i < out.size(); ++i) result[i] = static_cast<float>(static_cast<double>(in[i]) * scale);
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
