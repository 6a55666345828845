#include "reductions.h"

#include <algorithm>

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

Int32Reduction::Int32Reduction(int32_t* data, size_t count, ReduceOp op, uint32_t world_size)
    : data_(data),
      count_(count),
      op_(op),
      world_size_(static_cast<int32_t>(world_size)),
      chunks_(wire::layout_for(count).data_chunks) {}

void Int32Reduction::fill(uint32_t offset, int32_t* payload) {
  auto [begin, size] = chunk_span(offset, count_);
  std::copy_n(data_ + begin, size, payload);
  std::fill(payload + size, payload + kChunkElems, 0);
}

void Int32Reduction::consume(uint32_t offset, const int32_t* result) {
  auto [begin, size] = chunk_span(offset, count_);
  int32_t* out = data_ + begin;
  if (op_ == ReduceOp::Average) {
    for (size_t i = 0; i < size; ++i) out[i] = result[i] / world_size_;
  } else {
    std::copy_n(result, size, out);
  }
}

Float32Reduction::Float32Reduction(float* data, size_t count, ReduceOp op, uint32_t world_size)
    : data_(data),
      count_(count),
      world_size_(world_size),
      divisor_(op == ReduceOp::Average ? world_size : 1.0),
      data_chunks_(wire::layout_for(count).data_chunks),
      exponent_chunks_(wire::layout_for(count).exponent_chunks),
      exponents_(data_chunks_),
      exponents_known_(exponent_chunks_, false) {}

bool Float32Reduction::ready(uint32_t offset) const {
  return offset < exponent_chunks_ || exponents_known_[(offset - exponent_chunks_) / kChunkElems];
}

wire::ElemOp Float32Reduction::op(uint32_t offset) const {
  return offset < exponent_chunks_ ? wire::ElemOp::Max : wire::ElemOp::Sum;
}

void Float32Reduction::fill(uint32_t offset, int32_t* payload) {
  if (offset < exponent_chunks_) {
    auto [first, size] = chunk_span(offset, data_chunks_);
    for (size_t i = 0; i < size; ++i) {
      auto [begin, length] = chunk_span(static_cast<uint32_t>(first + i), count_);
      payload[i] = exponents_[first + i] = quant::chunk_exponent({data_ + begin, length});
    }
    std::fill(payload + size, payload + kChunkElems, 0);
    return;
  }
  uint32_t chunk = offset - exponent_chunks_;
  auto [begin, size] = chunk_span(chunk, count_);
  quant::quantize({data_ + begin, size}, exponents_[chunk], world_size_, {payload, kChunkElems});
}

void Float32Reduction::consume(uint32_t offset, const int32_t* result) {
  if (offset < exponent_chunks_) {
    auto [first, size] = chunk_span(offset, data_chunks_);
    std::copy_n(result, size, exponents_.data() + first);
    exponents_known_[offset] = true;
    return;
  }
  uint32_t chunk = offset - exponent_chunks_;
  auto [begin, size] = chunk_span(chunk, count_);
  quant::dequantize({result, size}, exponents_[chunk], world_size_, divisor_, {data_ + begin, size});
}

}  // namespace xagg::worker
