// The all-reduce operations of the public API as the pipeline runs them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pipeline.h"
#include "xagg/communicator.h"

namespace xagg::worker {

// int32: one chunk per kChunkElems elements, summed exactly.
class Int32Reduction final : public Reduction {
 public:
  Int32Reduction(int32_t* data, size_t count, ReduceOp op, uint32_t world_size);
  uint32_t chunk_count() const override { return chunks_; }
  bool ready(uint32_t) const override { return true; }
  bool gating(uint32_t) const override { return false; }
  wire::ElemOp op(uint32_t) const override { return wire::ElemOp::Sum; }
  void fill(uint32_t offset, int32_t* payload) override;
  void consume(uint32_t offset, const int32_t* result) override;

 private:
  int32_t* data_;
  size_t count_;
  ReduceOp op_;
  int32_t world_size_;
  uint32_t chunks_;
};

// float32 by block fixed-point quantization (xagg/quantize.h): first the
// exponent chunks (MAX of every rank's per-data-chunk exponents, one int32 per
// data chunk), then the data chunks (SUM of the values quantized with the
// common exponents). A data chunk is ready once the exponent chunk holding
// its exponent has its result, so the two kinds overlap on the wire.
class Float32Reduction final : public Reduction {
 public:
  Float32Reduction(float* data, size_t count, ReduceOp op, uint32_t world_size);
  uint32_t chunk_count() const override { return exponent_chunks_ + data_chunks_; }
  bool ready(uint32_t offset) const override;
  bool gating(uint32_t offset) const override { return offset < exponent_chunks_; }
  wire::ElemOp op(uint32_t offset) const override;
  void fill(uint32_t offset, int32_t* payload) override;
  void consume(uint32_t offset, const int32_t* result) override;

 private:
  float* data_;
  size_t count_;
  uint32_t world_size_;
  double divisor_;
  uint32_t data_chunks_;
  uint32_t exponent_chunks_;
  std::vector<int32_t> exponents_;       // per data chunk: local, then common once known
  std::vector<bool> exponents_known_;    // per exponent chunk
};

}  // namespace xagg::worker
