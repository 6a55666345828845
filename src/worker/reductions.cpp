#include "reductions.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "xagg/quantize.h"

namespace xagg::worker {
namespace {

// First element and length of a chunk of an array of count elements.
std::pair<size_t, size_t> chunk_span(uint32_t chunk, size_t count, uint32_t chunk_elements) {
  size_t begin = size_t{chunk} * chunk_elements;
  return {begin, std::min<size_t>(chunk_elements, count - begin)};
}

// An element's kind as a count in a 7-bit field of its own, so that the SUM
// over up to 64 ranks counts NaNs, +Infs and -Infs without carries.
constexpr int kKindBits = 7;
constexpr int32_t kKindMask = (1 << kKindBits) - 1;
constexpr int32_t kNaNKind = 1;
constexpr int32_t kPositiveInfinityKind = 1 << kKindBits;
constexpr int32_t kNegativeInfinityKind = 1 << (2 * kKindBits);

int32_t kind_of(float value) {
  if (std::isnan(value)) return kNaNKind;
  if (std::isinf(value)) return value > 0 ? kPositiveInfinityKind : kNegativeInfinityKind;
  return 0;
}

// The 16-bit wire's kinds (docs/protocol.md section 11): bits whose OR over
// the ranks tells what the counts tell, in 5 bits: some NaN, some +Inf, some
// -Inf, some element not -Inf, some element not +Inf.
constexpr int32_t kSomeNaNBit = 1, kSomePositiveBit = 2, kSomeNegativeBit = 4, kNotNegativeBit = 8,
                  kNotPositiveBit = 16;

int32_t kind_bits_of(float value) {
  if (std::isnan(value)) return kSomeNaNBit | kNotNegativeBit | kNotPositiveBit;
  if (std::isinf(value)) return value > 0 ? kSomePositiveBit | kNotNegativeBit : kSomeNegativeBit | kNotPositiveBit;
  return kNotNegativeBit | kNotPositiveBit;
}

// What an element's kinds over all ranks say.
struct Kinds {
  bool nan = false;
  bool positive = false;      // some rank's is +Inf
  bool negative = false;      // some rank's is -Inf
  bool all_positive = false;  // every rank's is +Inf
  bool all_negative = false;
};

Kinds kinds_of(int32_t result, bool narrow, uint32_t world_size) {
  if (narrow)
    return {(result & kSomeNaNBit) != 0, (result & kSomePositiveBit) != 0, (result & kSomeNegativeBit) != 0,
            (result & kNotPositiveBit) == 0, (result & kNotNegativeBit) == 0};
  const uint32_t nans = result & kKindMask;
  const uint32_t positive = (result >> kKindBits) & kKindMask;
  const uint32_t negative = (result >> (2 * kKindBits)) & kKindMask;
  return {nans > 0, positive > 0, negative > 0, positive == world_size, negative == world_size};
}

// An element by IEEE rules, from its kinds over the ranks and the reduction
// of the ranks' finite values.
float resolve_kinds(const Kinds& kinds, float finite, ReduceOp op) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInfinity = std::numeric_limits<float>::infinity();
  if (kinds.nan) return kNaN;
  switch (op) {
    case ReduceOp::Max:
      return kinds.positive ? kInfinity : kinds.all_negative ? -kInfinity : finite;
    case ReduceOp::Min:
      return kinds.negative ? -kInfinity : kinds.all_positive ? kInfinity : finite;
    case ReduceOp::Sum:
    case ReduceOp::Average:
      if (kinds.positive && kinds.negative) return kNaN;  // Inf - Inf
      return kinds.positive ? kInfinity : kinds.negative ? -kInfinity : finite;
  }
  return kNaN;
}

}  // namespace

wire::ElemOp element_op(ReduceOp op) {
  return op == ReduceOp::Max || op == ReduceOp::Min ? wire::ElemOp::Max : wire::ElemOp::Sum;
}

void complement(std::span<int32_t> values) {
  for (int32_t& value : values) value = ~value;
}

Int32Reduction::Int32Reduction(int32_t* data, size_t count, ReduceOp op, uint32_t world_size,
                               uint32_t chunk_elements, ScatterRole role)
    : data_(data),
      count_(count),
      op_(op),
      world_size_(static_cast<int32_t>(world_size)),
      chunk_elements_(chunk_elements),
      chunks_(wire::layout_for(count, chunk_elements).data_chunks),
      role_(role) {}

uint32_t Int32Reduction::fill(uint32_t offset, int32_t* payload) {
  auto [begin, size] = chunk_span(offset, count_, chunk_elements_);
  std::copy_n(data_ + begin, size, payload);
  if (op_ == ReduceOp::Min) complement({payload, size});
  return static_cast<uint32_t>(size);
}

void Int32Reduction::consume(uint32_t offset, std::span<const int32_t> result, std::vector<uint32_t>& /*redo*/) {
  int32_t* out = data_ + chunk_span(offset, count_, chunk_elements_).first;
  if (op_ == ReduceOp::Average) {
    // Exact only if the sum fitted in int32: a wrapped sum is divided as it is.
    for (size_t i = 0; i < result.size(); ++i) out[i] = result[i] / world_size_;
  } else if (op_ == ReduceOp::Min) {
    for (size_t i = 0; i < result.size(); ++i) out[i] = ~result[i];
  } else {
    std::ranges::copy(result, out);
  }
}

Float32Reduction::Float32Reduction(float* data, size_t count, ReduceOp op, uint32_t world_size,
                                   uint32_t chunk_elements, ScatterRole role, Lanes lanes)
    : data_(data),
      count_(count),
      world_size_(world_size),
      op_(op),
      divisor_(op == ReduceOp::Average ? world_size : 1.0),
      chunk_elements_(chunk_elements),
      role_(role),
      lanes_(lanes),
      layout_(wire::layout_for(count, chunk_elements, lanes.narrow)),
      data_chunks_(layout_.data_chunks),
      exponent_chunks_(layout_.exponent_chunks),
      local_exponents_(size_t{data_chunks_} * layout_.blocks_per_chunk),
      predicted_(size_t{data_chunks_} * layout_.blocks_per_chunk),
      exponents_(size_t{data_chunks_} * layout_.blocks_per_chunk),
      exponents_settled_(exponent_chunks_, false) {}

quant::Scale Float32Reduction::value_scale() const {
  return lanes_.narrow ? quant::Scale{quant::kNarrowValueBits, 0} : quant::wide_scale(world_size_);
}

quant::Scale Float32Reduction::result_scale() const {
  quant::Scale scale = value_scale();
  if (lanes_.narrow && element_op(op_) == wire::ElemOp::Sum) scale.sum_shift = lanes_.sum_shift;
  return scale;
}

std::pair<size_t, size_t> Float32Reduction::block_span(uint32_t chunk, uint32_t block) const {
  auto [chunk_begin, chunk_size] = chunk_span(chunk, count_, chunk_elements_);
  const size_t block_elements = lanes_.narrow ? wire::kNarrowBlockElems : chunk_elements_;
  const size_t offset = std::min<size_t>(size_t{block} * block_elements, chunk_size);
  return {chunk_begin + offset, std::min(block_elements, chunk_size - offset)};
}

void Float32Reduction::quantize_blocks(uint32_t chunk, std::span<const float> values, const int32_t* exponents,
                                       int32_t* payload) const {
  const size_t chunk_begin = chunk_span(chunk, count_, chunk_elements_).first;
  for (uint32_t block = 0; block < layout_.blocks_per_chunk; ++block) {
    auto [begin, size] = block_span(chunk, block);
    const size_t at = begin - chunk_begin;
    quant::quantize(values.subspan(at, size), exponents[block], value_scale(), {payload + at, size});
  }
  if (op_ == ReduceOp::Min) complement({payload, values.size()});
}

void Float32Reduction::place(std::span<int32_t> memory, uint32_t per_chunk) {
  // Chunk memory no reduction wrote must give no prediction, as a sentinel does.
  static_assert(Reduction::kNothingRemembered == quant::kZeroExponent);
  memory_ = memory;
  memory_per_chunk_ = per_chunk;
  const uint32_t blocks = layout_.blocks_per_chunk;
  for (uint32_t chunk = 0; chunk < data_chunks_; ++chunk) {
    // A block whose memory is a sentinel (all zero last time) predicts the
    // chunk's largest prediction: the chunk goes early if any block predicts.
    std::optional<int32_t> largest;
    const int32_t* remembered = &memory_[size_t{exponent_chunks_ + chunk} * memory_per_chunk_];
    for (uint32_t block = 0; block < blocks; ++block)
      if (auto predicted = quant::predicted_exponent(remembered[block]); predicted && (!largest || *predicted > *largest))
        largest = predicted;
    for (uint32_t block = 0; block < blocks; ++block) {
      auto predicted = quant::predicted_exponent(remembered[block]);
      predicted_[size_t{chunk} * blocks + block] = predicted ? predicted : largest;
    }
  }
}

bool Float32Reduction::ready(uint32_t offset) const {
  if (offset < exponent_chunks_) return true;
  uint32_t chunk = offset - exponent_chunks_;
  if (settled(chunk)) return true;
  // The local exponents are known: exponent chunks are filled first.
  for (size_t block = size_t{chunk} * layout_.blocks_per_chunk; block < size_t{chunk + 1} * layout_.blocks_per_chunk;
       ++block)
    if (!predicted_[block] || local_exponents_[block] > *predicted_[block]) return false;
  return true;
}

wire::ElemOp Float32Reduction::op(uint32_t offset) const {
  if (offset < exponent_chunks_) return wire::ElemOp::Max;
  auto non_finite = non_finite_.find(offset - exponent_chunks_);
  if (non_finite == non_finite_.end()) return element_op(op_);
  switch (non_finite->second.phase) {
    case NonFinitePhase::Kinds: return lanes_.narrow ? wire::ElemOp::Or : wire::ElemOp::Sum;
    case NonFinitePhase::FiniteExponent: return wire::ElemOp::Max;
    case NonFinitePhase::FiniteValues: break;
  }
  return element_op(op_);
}

ScatterRole Float32Reduction::scatter_role(uint32_t offset) const {
  if (offset < exponent_chunks_) return ScatterRole::None;
  auto non_finite = non_finite_.find(offset - exponent_chunks_);
  if (non_finite != non_finite_.end() && non_finite->second.phase == NonFinitePhase::FiniteExponent)
    return ScatterRole::None;
  return role_;
}

uint32_t Float32Reduction::fill(uint32_t offset, int32_t* payload) {
  const uint32_t blocks = layout_.blocks_per_chunk;
  if (offset < exponent_chunks_) {  // one exponent per block of each data chunk it covers
    auto [first, size] = chunk_span(offset, data_chunks_, layout_.chunks_per_exponent_chunk);
    for (size_t i = 0; i < size * blocks; ++i) {
      const auto chunk = static_cast<uint32_t>(first + i / blocks);
      auto [begin, length] = block_span(chunk, static_cast<uint32_t>(i % blocks));
      payload[i] = local_exponents_[first * blocks + i] = quant::chunk_exponent({data_ + begin, length});
    }
    return static_cast<uint32_t>(size * blocks);
  }
  uint32_t chunk = offset - exponent_chunks_;
  if (auto non_finite = non_finite_.find(chunk); non_finite != non_finite_.end())
    return fill_non_finite(chunk, non_finite->second.phase, payload);
  auto [begin, size] = chunk_span(chunk, count_, chunk_elements_);
  const size_t first_block = size_t{chunk} * blocks;
  std::array<int32_t, wire::kMaxBlocksPerChunk> exponents;
  for (uint32_t block = 0; block < blocks; ++block)
    exponents[block] = settled(chunk) ? exponents_[first_block + block] : *predicted_[first_block + block];
  quantize_blocks(chunk, {data_ + begin, size}, exponents.data(), payload);
  return static_cast<uint32_t>(size);
}

void Float32Reduction::consume(uint32_t offset, std::span<const int32_t> result, std::vector<uint32_t>& redo) {
  if (offset < exponent_chunks_) {
    settle(offset, result.data(), redo);
    return;
  }
  uint32_t chunk = offset - exponent_chunks_;
  if (auto non_finite = non_finite_.find(chunk); non_finite != non_finite_.end()) {
    if (consume_non_finite(chunk, non_finite->second, result))
      non_finite_.erase(non_finite);
    else
      redo.push_back(offset);  // the next phase, as a new use on every rank
    return;
  }
  if (result.empty()) return;  // a reduce-scatter chunk another rank owns
  if (settled(chunk))
    dequantize(chunk, result.data());
  else
    early_sums_.emplace(chunk, std::vector<int32_t>(result.begin(), result.end()));
}

void Float32Reduction::settle(uint32_t exponent_chunk, const int32_t* common, std::vector<uint32_t>& redo) {
  const uint32_t blocks = layout_.blocks_per_chunk;
  auto [first, size] = chunk_span(exponent_chunk, data_chunks_, layout_.chunks_per_exponent_chunk);
  for (size_t i = 0; i < size; ++i) {
    const auto chunk = static_cast<uint32_t>(first + i);
    const size_t first_block = size_t{chunk} * blocks;
    const bool predicted = predicted_[first_block].has_value();
    bool holds = predicted;
    bool non_finite = false;
    for (uint32_t block = 0; block < blocks; ++block) {
      const int32_t exponent = exponent_of(common[i * blocks + block]);
      memory_[size_t{exponent_chunks_ + chunk} * memory_per_chunk_ + block] = exponent;
      exponents_[first_block + block] = exponent;
      non_finite = non_finite || exponent == quant::kNonFiniteExponent;
      holds = holds && quant::prediction_holds(*predicted_[first_block + block], exponent);
    }
    if (holds) {
      for (uint32_t block = 0; block < blocks; ++block) exponents_[first_block + block] = *predicted_[first_block + block];
      continue;
    }
    if (non_finite) non_finite_.try_emplace(chunk);
    if (predicted) {
      redo.push_back(exponent_chunks_ + chunk);
      early_sums_.erase(chunk);
    }
  }
  exponents_settled_[exponent_chunk] = true;
  for (auto early = early_sums_.lower_bound(static_cast<uint32_t>(first));
       early != early_sums_.end() && early->first < first + size; early = early_sums_.erase(early))
    dequantize(early->first, early->second.data());
}

void Float32Reduction::dequantize(uint32_t chunk, const int32_t* sums) {
  auto [chunk_begin, chunk_size] = chunk_span(chunk, count_, chunk_elements_);
  std::array<int32_t, wire::kMaxChunkElems> uncomplemented;
  if (op_ == ReduceOp::Min) {
    std::copy_n(sums, chunk_size, uncomplemented.begin());
    complement({uncomplemented.data(), chunk_size});
    sums = uncomplemented.data();
  }
  for (uint32_t block = 0; block < layout_.blocks_per_chunk; ++block) {
    auto [begin, size] = block_span(chunk, block);
    quant::dequantize({sums + (begin - chunk_begin), size}, exponents_[size_t{chunk} * layout_.blocks_per_chunk + block],
                      result_scale(), divisor_, {data_ + begin, size});
  }
}

uint32_t Float32Reduction::fill_non_finite(uint32_t chunk, NonFinitePhase phase, int32_t* payload) const {
  auto [begin, size] = chunk_span(chunk, count_, chunk_elements_);
  std::span<const float> values(data_ + begin, size);
  const uint32_t blocks = layout_.blocks_per_chunk;
  switch (phase) {
    case NonFinitePhase::Kinds:
      std::ranges::transform(values, payload, lanes_.narrow ? kind_bits_of : kind_of);
      break;
    case NonFinitePhase::FiniteExponent:  // one per block
      for (uint32_t block = 0; block < blocks; ++block) {
        auto [block_begin, block_size] = block_span(chunk, block);
        payload[block] = quant::finite_exponent({data_ + block_begin, block_size});
      }
      return blocks;
    case NonFinitePhase::FiniteValues: {
      std::array<float, wire::kMaxChunkElems> finite;
      std::ranges::transform(values, finite.begin(), [](float value) { return std::isfinite(value) ? value : 0.0f; });
      quantize_blocks(chunk, {finite.data(), size}, &exponents_[size_t{chunk} * blocks], payload);
      // Under MAX a non-finite element's place loses to every finite value; its kinds decide it.
      if (element_op(op_) == wire::ElemOp::Max)
        for (size_t i = 0; i < size; ++i)
          if (!std::isfinite(values[i])) payload[i] = std::numeric_limits<int32_t>::min();
      break;
    }
  }
  return static_cast<uint32_t>(size);
}

bool Float32Reduction::consume_non_finite(uint32_t chunk, NonFiniteChunk& state, std::span<const int32_t> result) {
  const uint32_t blocks = layout_.blocks_per_chunk;
  switch (state.phase) {
    case NonFinitePhase::Kinds:
      state.kinds.assign(result.begin(), result.end());
      state.phase = NonFinitePhase::FiniteExponent;
      return false;
    case NonFinitePhase::FiniteExponent:
      // A result, so also the same prediction on every rank for the chunk's next use.
      for (uint32_t block = 0; block < blocks; ++block)
        exponents_[size_t{chunk} * blocks + block] =
            memory_[size_t{exponent_chunks_ + chunk} * memory_per_chunk_ + block] = exponent_of(result[block]);
      state.phase = NonFinitePhase::FiniteValues;
      return false;
    case NonFinitePhase::FiniteValues:
      break;
  }
  if (result.empty()) return true;  // a reduce-scatter chunk another rank owns
  dequantize(chunk, result.data());
  float* out = data_ + chunk_span(chunk, count_, chunk_elements_).first;
  for (size_t i = 0; i < result.size(); ++i)
    out[i] = resolve_kinds(kinds_of(state.kinds[i], lanes_.narrow, world_size_), out[i], op_);
  return true;
}

}  // namespace xagg::worker
