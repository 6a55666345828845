#include "reductions.h"

#include <algorithm>
#include <array>

#include "xagg/quantize.h"

namespace xagg::worker {
namespace {

constexpr size_t kChunkElems = wire::kChunkElems;

// First element and length of a chunk of an array of count elements.
std::pair<size_t, size_t> chunk_span(uint32_t chunk, size_t count) {
  size_t begin = size_t{chunk} * kChunkElems;
  return {begin, std::min(kChunkElems, count - begin)};
}

}  // namespace

wire::ElemOp element_op(ReduceOp op) {
  return op == ReduceOp::Max || op == ReduceOp::Min ? wire::ElemOp::Max : wire::ElemOp::Sum;
}

void complement(std::span<int32_t> values) {
  for (int32_t& value : values) value = ~value;
}

Int32Reduction::Int32Reduction(int32_t* data, size_t count, ReduceOp op, uint32_t world_size)
    : data_(data),
      count_(count),
      op_(op),
      world_size_(static_cast<int32_t>(world_size)),
      chunks_(wire::layout_for(count).data_chunks) {}

uint32_t Int32Reduction::fill(uint32_t offset, int32_t* payload) {
  auto [begin, size] = chunk_span(offset, count_);
  std::copy_n(data_ + begin, size, payload);
  if (op_ == ReduceOp::Min) complement({payload, size});
  return static_cast<uint32_t>(size);
}

void Int32Reduction::consume(uint32_t offset, std::span<const int32_t> result, std::vector<uint32_t>& /*redo*/) {
  int32_t* out = data_ + chunk_span(offset, count_).first;
  if (op_ == ReduceOp::Average) {
    // Exact only if the sum fitted in int32: a wrapped sum is divided as it is.
    for (size_t i = 0; i < result.size(); ++i) out[i] = result[i] / world_size_;
  } else if (op_ == ReduceOp::Min) {
    for (size_t i = 0; i < result.size(); ++i) out[i] = ~result[i];
  } else {
    std::ranges::copy(result, out);
  }
}

Float32Reduction::Float32Reduction(float* data, size_t count, ReduceOp op, uint32_t world_size)
    : data_(data),
      count_(count),
      world_size_(world_size),
      op_(op),
      divisor_(op == ReduceOp::Average ? world_size : 1.0),
      data_chunks_(wire::layout_for(count).data_chunks),
      exponent_chunks_(wire::layout_for(count).exponent_chunks),
      local_exponents_(data_chunks_),
      predicted_(data_chunks_),
      exponents_(data_chunks_),
      exponents_settled_(exponent_chunks_, false) {}

void Float32Reduction::place(std::span<int32_t> memory) {
  // Chunk memory no reduction wrote must give no prediction, as a sentinel does.
  static_assert(Reduction::kNothingRemembered == quant::kZeroExponent);
  memory_ = memory;
  for (uint32_t chunk = 0; chunk < data_chunks_; ++chunk)
    predicted_[chunk] = quant::predicted_exponent(memory_[exponent_chunks_ + chunk]);
}

bool Float32Reduction::ready(uint32_t offset) const {
  if (offset < exponent_chunks_) return true;
  uint32_t chunk = offset - exponent_chunks_;
  // The local exponent is known: exponent chunks are filled first.
  return settled(chunk) || (predicted_[chunk] && local_exponents_[chunk] <= *predicted_[chunk]);
}

wire::ElemOp Float32Reduction::op(uint32_t offset) const {
  return offset < exponent_chunks_ ? wire::ElemOp::Max : element_op(op_);
}

uint32_t Float32Reduction::fill(uint32_t offset, int32_t* payload) {
  if (offset < exponent_chunks_) {  // one exponent per data chunk
    auto [first, size] = chunk_span(offset, data_chunks_);
    for (size_t i = 0; i < size; ++i) {
      auto [begin, length] = chunk_span(static_cast<uint32_t>(first + i), count_);
      payload[i] = local_exponents_[first + i] = quant::chunk_exponent({data_ + begin, length});
    }
    return static_cast<uint32_t>(size);
  }
  uint32_t chunk = offset - exponent_chunks_;
  auto [begin, size] = chunk_span(chunk, count_);
  int32_t exponent = settled(chunk) ? exponents_[chunk] : *predicted_[chunk];
  quant::quantize({data_ + begin, size}, exponent, world_size_, {payload, size});
  if (op_ == ReduceOp::Min) complement({payload, size});
  return static_cast<uint32_t>(size);
}

void Float32Reduction::consume(uint32_t offset, std::span<const int32_t> result, std::vector<uint32_t>& redo) {
  if (offset < exponent_chunks_) {
    settle(offset, result.data(), redo);
    return;
  }
  uint32_t chunk = offset - exponent_chunks_;
  if (settled(chunk))
    dequantize(chunk, result.data());
  else
    early_sums_.emplace(chunk, std::vector<int32_t>(result.begin(), result.end()));
}

void Float32Reduction::settle(uint32_t exponent_chunk, const int32_t* common, std::vector<uint32_t>& redo) {
  auto [first, size] = chunk_span(exponent_chunk, data_chunks_);
  for (size_t i = 0; i < size; ++i) {
    const uint32_t chunk = static_cast<uint32_t>(first + i);
    memory_[exponent_chunks_ + chunk] = common[i];
    const bool predicted = predicted_[chunk].has_value();
    if (predicted && quant::prediction_holds(*predicted_[chunk], common[i])) {
      exponents_[chunk] = *predicted_[chunk];
      continue;
    }
    exponents_[chunk] = common[i];
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
  auto [begin, size] = chunk_span(chunk, count_);
  std::array<int32_t, kChunkElems> uncomplemented;
  if (op_ == ReduceOp::Min) {
    std::copy_n(sums, size, uncomplemented.begin());
    complement({uncomplemented.data(), size});
    sums = uncomplemented.data();
  }
  quant::dequantize({sums, size}, exponents_[chunk], world_size_, divisor_, {data_ + begin, size});
}

}  // namespace xagg::worker
