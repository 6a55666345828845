// The Gloo baseline's float16 arithmetic (src/backends/float16.h): its F16C
// path gives the bits of IEEE binary16 as GCC's _Float16 computes it (round to
// nearest even, subnormals, overflow to infinity), and lengths that are no
// multiple of the vector width take the scalar tail.
#include "float16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace xagg::backends {
namespace {

gloo::float16 half_of_bits(uint16_t bits) {
  gloo::float16 half;
  half.x = bits;
  return half;
}

float value_of(gloo::float16 half) { return static_cast<float>(std::bit_cast<_Float16>(half.x)); }
uint16_t rounded(float value) { return std::bit_cast<uint16_t>(static_cast<_Float16>(value)); }

float float_of_bits(uint32_t bits) {
  float value = 0;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Every float16 bit pattern but the NaNs (any NaN may stand for another).
std::vector<gloo::float16> every_finite_or_infinite_half() {
  std::vector<gloo::float16> halves;
  for (uint32_t bits = 0; bits <= 0xffff; ++bits)
    if ((bits & 0x7c00) != 0x7c00 || (bits & 0x03ff) == 0) halves.push_back(half_of_bits(static_cast<uint16_t>(bits)));
  return halves;
}

void expect_same_bits(const std::vector<gloo::float16>& actual, const std::vector<uint16_t>& expected,
                      const std::vector<float>& inputs) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    ASSERT_EQ(actual[i].x, expected[i]) << "element " << i << ", input " << inputs[i];
}

TEST(Float16, ToFloatIsExactForEveryHalf) {
  const std::vector<gloo::float16> halves = every_finite_or_infinite_half();
  std::vector<float> floats(halves.size());
  float16::to_float(halves.data(), floats.data(), halves.size());
  for (size_t i = 0; i < halves.size(); ++i) ASSERT_EQ(floats[i], value_of(halves[i])) << "bits " << halves[i].x;
  gloo::float16 nan = half_of_bits(0x7e00);
  float converted = 0;
  float16::to_float(&nan, &converted, 1);
  EXPECT_TRUE(std::isnan(converted));
}

TEST(Float16, FromFloatRoundsToNearestEven) {
  std::vector<float> inputs;
  // Every half, and every midpoint between neighbours (ties go to the even one)
  // with the floats just either side of it.
  for (const gloo::float16& half : every_finite_or_infinite_half()) {
    const float value = value_of(half);
    inputs.push_back(value);
    if (std::isinf(value)) continue;
    const float next = value_of(half_of_bits(static_cast<uint16_t>(half.x + 1)));
    if (!std::isfinite(next) || std::signbit(next) != std::signbit(value)) continue;
    const float middle = (value + next) / 2;  // exact in float32
    inputs.insert(inputs.end(), {middle, std::nextafter(middle, 0.0f), std::nextafter(middle, 1e9f * value)});
  }
  // Beyond the largest finite half (65504): 65519.996 still rounds down, 65520 to infinity.
  inputs.insert(inputs.end(), {65519.996f, 65520.0f, -65520.0f, 1e30f, std::numeric_limits<float>::infinity(),
                               float_of_bits(0x33000000), float_of_bits(0x33000001), 1e-30f, -0.0f});
  std::mt19937 random(7);
  std::uniform_int_distribution<uint32_t> bits(0, 0x7f7fffff);  // every finite magnitude, then a random sign
  for (int i = 0; i < 200000; ++i) inputs.push_back((i % 2 ? -1.0f : 1.0f) * float_of_bits(bits(random)));
  inputs.push_back(1.0f);  // a length that is no multiple of the vector width

  std::vector<gloo::float16> actual(inputs.size());
  std::vector<uint16_t> expected(inputs.size());
  float16::from_float(inputs.data(), actual.data(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) expected[i] = rounded(inputs[i]);
  expect_same_bits(actual, expected, inputs);
  // With a divisor (an average's world size), as dividing first and converting.
  float16::from_float(inputs.data(), actual.data(), inputs.size(), 3.0f);
  for (size_t i = 0; i < inputs.size(); ++i) expected[i] = rounded(inputs[i] / 3.0f);
  expect_same_bits(actual, expected, inputs);
}

TEST(Float16, AddRoundsEverySumToFloat16) {
  const std::vector<gloo::float16> halves = every_finite_or_infinite_half();
  std::mt19937 random(11);
  std::uniform_int_distribution<size_t> pick(0, halves.size() - 1);
  constexpr size_t kPairs = 500003;  // no multiple of the vector width
  std::vector<gloo::float16> a(kPairs), b(kPairs), sum(kPairs);
  for (size_t i = 0; i < kPairs; ++i) {
    a[i] = halves[pick(random)];
    // Every other pair close in magnitude, so that the sums round (and cancel) often.
    b[i] = i % 2 ? halves[pick(random)]
                 : half_of_bits(static_cast<uint16_t>((a[i].x ^ (random() % 2 ? 0x8000 : 0)) + random() % 64));
  }
  float16::add(sum.data(), a.data(), b.data(), kPairs);
  for (size_t i = 0; i < kPairs; ++i) {
    const _Float16 expected = std::bit_cast<_Float16>(a[i].x) + std::bit_cast<_Float16>(b[i].x);
    if (std::isnan(static_cast<float>(expected))) {
      ASSERT_TRUE(std::isnan(value_of(sum[i]))) << "element " << i;
      continue;
    }
    ASSERT_EQ(sum[i].x, std::bit_cast<uint16_t>(expected))
        << "element " << i << ": " << value_of(a[i]) << " + " << value_of(b[i]);
  }
  // In place, as Gloo's ring calls it (the output is one of the inputs).
  std::vector<gloo::float16> in_place = b;
  float16::add(in_place.data(), a.data(), in_place.data(), kPairs);
  for (size_t i = 0; i < kPairs; ++i)
    if (!std::isnan(value_of(sum[i]))) {
      ASSERT_EQ(in_place[i].x, sum[i].x) << "element " << i;
    }
}

}  // namespace
}  // namespace xagg::backends
