// The all-reduce operations of the public API as the pipeline runs them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "pipeline.h"
#include "xagg/communicator.h"
#include "xagg/quantize.h"

namespace xagg::worker {

// The aggregator's operation for a reduction's data: MAX for Max and Min.
wire::ElemOp element_op(ReduceOp op);
// Min goes through MAX as the bitwise complement: ~max(~a, ~b) == min(a, b).
void complement(std::span<int32_t> values);

// The lanes a reduction's packets carry: int32, or on the 16-bit wire
// (docs/protocol.md section 11) int16, whose SUM results the aggregators
// divided by 2^sum_shift.
struct Lanes {
  bool narrow = false;
  int sum_shift = 0;
};

// The reductions split their data into chunks of the job's chunk_elements
// (1 .. wire::kMaxChunkElems), the last one shorter. As one operation of a
// reduce-scatter (role Owner or Other) their data chunks go to the owner alone.

// int32: one chunk per chunk_elements elements, summed exactly.
class Int32Reduction final : public Reduction {
 public:
  Int32Reduction(int32_t* data, size_t count, ReduceOp op, uint32_t world_size, uint32_t chunk_elements,
                 ScatterRole role = ScatterRole::None);
  uint32_t chunk_count() const override { return chunks_; }
  std::span<const std::byte> buffer() const override { return std::as_bytes(std::span(data_, count_)); }
  bool ready(uint32_t) const override { return true; }
  bool gating(uint32_t) const override { return false; }
  wire::ElemOp op(uint32_t) const override { return element_op(op_); }
  ScatterRole scatter_role(uint32_t) const override { return role_; }
  uint32_t fill(uint32_t offset, int32_t* payload) override;
  void consume(uint32_t offset, std::span<const int32_t> result, std::vector<uint32_t>& redo) override;

 private:
  int32_t* data_;
  size_t count_;
  ReduceOp op_;
  int32_t world_size_;
  uint32_t chunk_elements_;
  uint32_t chunks_;
  ScatterRole role_;
};

// float32 by block fixed-point quantization (xagg/quantize.h): the exponent
// chunks (MAX of every rank's per-data-chunk exponents, one int32 per data
// chunk) go first, then the data chunks (SUM of the values quantized with the
// common exponents). A data chunk goes out once the exponent chunk holding
// its exponent has its result, or at once with an exponent predicted from its
// chunk's previous use (the same bucket one step earlier) if its own values
// fit. When the common exponent shows that a prediction did not hold, every
// rank redoes the chunk with the common exponent.
//
// A data chunk that holds NaN or Inf on some rank (common exponent
// kNonFiniteExponent) is carried element-exact instead, in three more uses of
// its chunk (docs/protocol.md section 5.4): the SUM of per-element kinds
// (NaN, +Inf, -Inf counts; on the 16-bit wire the OR of kind bits), the MAX of the ranks' exponents over their finite
// values, and the finite values quantized with it; the kinds then decide each
// element by IEEE rules.
class Float32Reduction final : public Reduction {
 public:
  Float32Reduction(float* data, size_t count, ReduceOp op, uint32_t world_size, uint32_t chunk_elements,
                   ScatterRole role = ScatterRole::None, Lanes lanes = {});
  bool narrow() const override { return lanes_.narrow; }
  uint32_t chunk_count() const override { return exponent_chunks_ + data_chunks_; }
  std::span<const std::byte> buffer() const override { return std::as_bytes(std::span(data_, count_)); }
  void place(std::span<int32_t> memory, uint32_t per_chunk) override;
  bool ready(uint32_t offset) const override;
  bool gating(uint32_t offset) const override { return offset < exponent_chunks_; }
  wire::ElemOp op(uint32_t offset) const override;
  // Every rank needs the exponents, including a non-finite chunk's finite exponent.
  ScatterRole scatter_role(uint32_t offset) const override;
  uint32_t fill(uint32_t offset, int32_t* payload) override;
  void consume(uint32_t offset, std::span<const int32_t> result, std::vector<uint32_t>& redo) override;

 private:
  enum class NonFinitePhase : uint8_t { Kinds, FiniteExponent, FiniteValues };
  struct NonFiniteChunk {
    NonFinitePhase phase = NonFinitePhase::Kinds;
    std::vector<int32_t> kinds;  // per element, once summed
  };

  bool settled(uint32_t chunk) const { return exponents_settled_[chunk / layout_.chunks_per_exponent_chunk]; }
  // The elements of a data chunk's block: on the 16-bit wire kNarrowBlockElems
  // of the chunk's (the last shorter, or none past its end), else the chunk.
  std::pair<size_t, size_t> block_span(uint32_t chunk, uint32_t block) const;
  // Per block of the chunk, with the chunk's blocks_per_chunk exponents.
  void quantize_blocks(uint32_t chunk, std::span<const float> values, const int32_t* exponents,
                       int32_t* payload) const;
  // What each rank's values are quantized with, and what the results of the op carry.
  quant::Scale value_scale() const;
  quant::Scale result_scale() const;
  int32_t exponent_of(int32_t result) const { return lanes_.narrow ? quant::exponent_of_lane(result) : result; }
  void settle(uint32_t exponent_chunk, const int32_t* common, std::vector<uint32_t>& redo);
  void dequantize(uint32_t chunk, const int32_t* sums);
  uint32_t fill_non_finite(uint32_t chunk, NonFinitePhase phase, int32_t* payload) const;
  // Takes the result of the chunk's current phase; true once the chunk is done.
  bool consume_non_finite(uint32_t chunk, NonFiniteChunk& state, std::span<const int32_t> result);

  float* data_;
  size_t count_;
  uint32_t world_size_;
  ReduceOp op_;
  double divisor_;
  uint32_t chunk_elements_;
  ScatterRole role_;
  Lanes lanes_;
  wire::ChunkLayout layout_;
  uint32_t data_chunks_;
  uint32_t exponent_chunks_;
  // Per offset, memory_per_chunk_ each: data chunks keep their blocks' common exponents.
  std::span<int32_t> memory_;
  uint32_t memory_per_chunk_ = 1;
  // Per block of each data chunk (blocks_per_chunk each):
  std::vector<int32_t> local_exponents_;
  std::vector<std::optional<int32_t>> predicted_;  // all or none of a chunk's blocks
  std::vector<int32_t> exponents_;                 // the one its values use, once settled
  std::vector<bool> exponents_settled_;          // per exponent chunk
  // Sums of data chunks answered before their exponents settled: a failed
  // prediction would make them wrong, and the input must stay for the redo.
  std::map<uint32_t, std::vector<int32_t>> early_sums_;
  std::map<uint32_t, NonFiniteChunk> non_finite_;  // per data chunk on the non-finite path
};

}  // namespace xagg::worker
