// Which aggregator holds which of a job's chunks (docs/protocol.md section 6).
//
// A job's chunk indexes 0..C-1 (the layout of section 1, the same as with one
// aggregator) are dealt out to its K aggregators in a repeating pattern of
// P = sum of the weights places, built by smooth weighted round robin, so
// that consecutive chunks, and with them every all-reduce's chunks, are
// spread over all K in proportion to the weights. Each aggregator numbers the
// chunks it holds from 0 in job order: those are the indexes its packets carry.
#pragma once

#include <cstdint>
#include <vector>

#include "control_messages.h"

namespace xagg {

class ShardPlacement {
 public:
  static constexpr uint32_t kMaxShards = 64;
  static constexpr uint32_t kMaxWeight = control::kMaxShardWeight;

  // weights: one per aggregator, each 1..kMaxWeight, 1..kMaxShards of them.
  // Throws ConfigError naming the problem.
  ShardPlacement(std::vector<uint32_t> weights, uint32_t job_chunks);

  uint32_t shards() const { return static_cast<uint32_t>(weights_.size()); }
  uint32_t job_chunks() const { return job_chunks_; }
  uint32_t shard_of(uint32_t chunk) const { return pattern_[chunk % period_]; }
  // The chunk's index at its aggregator.
  uint32_t local_index(uint32_t chunk) const {
    uint32_t place = chunk % period_;
    return chunk / period_ * weights_[pattern_[place]] + turn_[place];
  }
  // The job chunk that aggregator `shard` numbers `local`.
  uint32_t job_chunk(uint32_t shard, uint32_t local) const {
    uint32_t weight = weights_[shard];
    return local / weight * period_ + places_[shard][local % weight];
  }
  // How many of the job's chunks the aggregator holds.
  uint32_t shard_chunks(uint32_t shard) const { return shard_chunks_[shard]; }

 private:
  std::vector<uint32_t> weights_;
  uint32_t job_chunks_;
  uint32_t period_ = 0;
  std::vector<uint32_t> pattern_;              // place in the period -> aggregator
  std::vector<uint32_t> turn_;                 // place -> how often its aggregator came earlier in the period
  std::vector<std::vector<uint32_t>> places_;  // aggregator -> its places in the period, ascending
  std::vector<uint32_t> shard_chunks_;
};

}  // namespace xagg
