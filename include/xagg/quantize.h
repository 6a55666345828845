// Block fixed-point quantization of float32 gradients (as SwitchML's
// per-packet exponents): every rank scales a chunk by the same power of two,
// the aggregator sums int32, and the sum is scaled back.
//
// Per data chunk each rank computes its local exponent (chunk_exponent), the
// ranks MAX-all-reduce the exponents, quantize with the common exponent e and
// SUM-all-reduce the integers. With S = 30 - ceil(log2 N), every |q| <= 2^S,
// so the sum of N values stays within 2^30 and cannot overflow int32.
//
// Sentinels: an all-zero chunk has exponent kZeroExponent (the smallest int32,
// so any rank with data wins the MAX); a chunk holding NaN or +-Inf has
// kNonFiniteExponent (the largest, so it always wins), which sends the chunk
// down an element-exact path of its own (docs/protocol.md section 5).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>

namespace xagg::quant {

inline constexpr int32_t kZeroExponent = std::numeric_limits<int32_t>::min();
inline constexpr int32_t kNonFiniteExponent = std::numeric_limits<int32_t>::max();

// ceil(log2(world_size)) for world_size >= 1.
int ceil_log2(uint32_t world_size);

// S: quantized values lie in [-2^S, 2^S].
int scale_bits(uint32_t world_size);

// Smallest e with max|x| < 2^e (frexp's exponent), or one of the sentinels.
int32_t chunk_exponent(std::span<const float> values);

// chunk_exponent of the chunk's finite values only: NaN and Inf left out.
int32_t finite_exponent(std::span<const float> values);

// How a reduction's values are scaled: each rank sends q with |q| <=
// 2^value_bits, and a result r stands for r * 2^sum_shift of those units (the
// aggregators divided the sum by 2^sum_shift, rounding). The 32-bit wire:
// value_bits = S, sum_shift 0. The 16-bit wire (docs/protocol.md section 11):
// value_bits = kNarrowValueBits, sum_shift the job's total for a SUM, 0 for MAX.
struct Scale {
  int value_bits = 0;
  int sum_shift = 0;
};
inline constexpr int kNarrowValueBits = 14;  // 2^14 fits an int16 lane, rounding included
Scale wide_scale(uint32_t world_size);

// out[i] = round(values[i] * 2^(value_bits - exponent)); zeros for either
// sentinel. Every value must be finite.
// values.size() <= out.size(); the rest of out is zero-padded.
void quantize(std::span<const float> values, int32_t exponent, Scale scale, std::span<int32_t> out);
void quantize(std::span<const float> values, int32_t exponent, uint32_t world_size, std::span<int32_t> out);

// out[i] = sums[i] * 2^(exponent - value_bits + sum_shift) / divisor,
// computed in double then rounded to float once; NaN for kNonFiniteExponent,
// zero for kZeroExponent. Reads out.size() sums.
void dequantize(std::span<const int32_t> sums, int32_t exponent, Scale scale, double divisor, std::span<float> out);
void dequantize(std::span<const int32_t> sums, int32_t exponent, uint32_t world_size, double divisor,
                std::span<float> out);

// The 16-bit wire's exponent lanes carry the sentinels as int16's extremes:
// the exponent a widened lane stands for.
int32_t exponent_of_lane(int32_t lane);

// The sum shift a 16-bit SUM's result carries (docs/protocol.md section 11):
// ceil(log2 N) on one level; ceil(log2 ranks_per_leaf) + ceil(log2 leaves)
// in two levels (ranks_per_leaf > 0).
int narrow_sum_shift(uint32_t world_size, uint32_t ranks_per_leaf);

// Largest absolute error of a SUM on the 16-bit wire, before the final
// rounding to float, for the exponent u its values use: half a step
// 2^(u - kNarrowValueBits) per rank, plus half a step of each rescaling (the
// aggregator's, or in two levels every leaf's and the root's):
// 2^(u - 15) * (N + 2^H) on one level, 2^(u - 15) * (N + L * 2^h + 2^H) with
// L leaves shifting by h. 0 for kZeroExponent, +infinity for kNonFiniteExponent.
double narrow_error_bound(int32_t exponent, uint32_t world_size, uint32_t ranks_per_leaf);

// Largest absolute error of a dequantized SUM before its final rounding to
// float: N * 2^(e - 31 + ceil(log2 N)), i.e. half a quantization step per
// rank. 0 for kZeroExponent, +infinity for kNonFiniteExponent.
double error_bound(int exponent, uint32_t world_size);

// Predicted exponents (docs/protocol.md section 5): a data chunk's values may
// go out before the ranks agree on its exponent, quantized with a prediction
// from the common exponent of the chunk's previous use, since a layer's
// gradient magnitudes change little from step to step. Then the exponent a
// result uses lies in [e, e + kMaxExponentExcess] for the common exponent e,
// and its error bound is error_bound(e + kMaxExponentExcess).
// A prediction that fails costs a resend of the chunk, which on a slow link
// is the whole bucket's transfer time again (40 ms for 2.5 MB at 0.5 Gbit/s):
// room for a fourfold change either way, at up to 4 bits of precision, keeps
// the chunk's largest values as precise as float32 for up to 4 ranks.
inline constexpr int kPredictionMargin = 2;   // room for the chunk's maximum to grow fourfold
inline constexpr int kMaxExponentExcess = 4;  // precision given up, in bits, at most (a fourfold shrink)

// The exponent to try after a use whose common exponent was `previous`;
// none after a sentinel (it says nothing about magnitudes).
std::optional<int32_t> predicted_exponent(int32_t previous);

// Whether values quantized with `predicted` make a valid result for common
// exponent `common`: nothing overflows (common <= predicted) and at most
// kMaxExponentExcess bits are lost. An all-zero chunk is exact with any
// exponent; a chunk with NaN or Inf never matches a prediction.
bool prediction_holds(int32_t predicted, int32_t common);

}  // namespace xagg::quant
