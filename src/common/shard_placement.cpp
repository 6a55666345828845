#include "shard_placement.h"

#include <fmt/format.h>

#include "xagg/errors.h"

namespace xagg {

ShardPlacement::ShardPlacement(std::vector<uint32_t> weights, uint32_t job_chunks)
    : weights_(std::move(weights)), job_chunks_(job_chunks), places_(weights_.size()) {
  if (weights_.empty() || weights_.size() > kMaxShards)
    throw ConfigError(fmt::format("{} aggregators: a job has 1 to {}", weights_.size(), kMaxShards));
  for (size_t shard = 0; shard < weights_.size(); ++shard) {
    if (weights_[shard] == 0 || weights_[shard] > kMaxWeight)
      throw ConfigError(fmt::format("aggregator {}'s weight {} is not in 1..{}", shard, weights_[shard], kMaxWeight));
    period_ += weights_[shard];
  }
  // Smooth weighted round robin: each place goes to the aggregator with the
  // most credit (the lowest index on a tie), which then pays the period.
  std::vector<int64_t> credit(weights_.size(), 0);
  for (uint32_t place = 0; place < period_; ++place) {
    uint32_t chosen = 0;
    for (uint32_t shard = 0; shard < weights_.size(); ++shard) {
      credit[shard] += weights_[shard];
      if (credit[shard] > credit[chosen]) chosen = shard;
    }
    credit[chosen] -= period_;
    pattern_.push_back(chosen);
    turn_.push_back(static_cast<uint32_t>(places_[chosen].size()));
    places_[chosen].push_back(place);
  }
  for (uint32_t shard = 0; shard < weights_.size(); ++shard) {
    uint32_t in_last_period = 0;
    for (uint32_t place = 0; place < job_chunks % period_; ++place) in_last_period += pattern_[place] == shard;
    shard_chunks_.push_back(job_chunks / period_ * weights_[shard] + in_last_period);
  }
}

}  // namespace xagg
