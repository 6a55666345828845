#include "float16.h"

#include <immintrin.h>

#include <bit>
#include <cstdint>

namespace xagg::backends::float16 {
namespace {

// Every x86-64 CPU since 2012 has F16C; without it everything takes the scalar path.
bool has_f16c() {
  static const bool supported = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return supported;
}

_Float16 as_half(gloo::float16 value) { return std::bit_cast<_Float16>(value.x); }
gloo::float16 from_half(_Float16 value) {
  gloo::float16 result;
  result.x = std::bit_cast<uint16_t>(value);
  return result;
}

constexpr size_t kLanes = 8;
constexpr int kNearestEven = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// Each returns how many elements it did: whole groups of kLanes.
__attribute__((target("avx,f16c"))) size_t from_float_f16c(const float* in, gloo::float16* out, size_t count,
                                                           float divisor) {
  const __m256 by = _mm256_set1_ps(divisor);
  size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    const __m256 values = _mm256_div_ps(_mm256_loadu_ps(in + i), by);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(values, kNearestEven));
  }
  return i;
}

__attribute__((target("avx,f16c"))) size_t to_float_f16c(const gloo::float16* in, float* out, size_t count) {
  size_t i = 0;
  for (; i + kLanes <= count; i += kLanes)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  return i;
}

// Two float16 values add exactly enough in float32 (24 >= 2 x 11 + 2 bits)
// that rounding the float32 sum to float16 is the correctly rounded float16 sum.
__attribute__((target("avx,f16c"))) size_t add_f16c(gloo::float16* out, const gloo::float16* a, const gloo::float16* b,
                                                    size_t count) {
  size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    const __m256 left = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 right = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_add_ps(left, right), kNearestEven));
  }
  return i;
}

}  // namespace

void from_float(const float* in, gloo::float16* out, size_t count, float divisor) {
  for (size_t i = has_f16c() ? from_float_f16c(in, out, count, divisor) : 0; i < count; ++i)
    out[i] = from_half(static_cast<_Float16>(in[i] / divisor));
}

void to_float(const gloo::float16* in, float* out, size_t count) {
  for (size_t i = has_f16c() ? to_float_f16c(in, out, count) : 0; i < count; ++i)
    out[i] = static_cast<float>(as_half(in[i]));
}

void add(gloo::float16* out, const gloo::float16* a, const gloo::float16* b, size_t count) {
  for (size_t i = has_f16c() ? add_f16c(out, a, b, count) : 0; i < count; ++i)
    out[i] = from_half(as_half(a[i]) + as_half(b[i]));
}

}  // namespace xagg::backends::float16
