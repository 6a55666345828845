// The placement of a job's chunks over its aggregators (docs/protocol.md
// section 6): a bijection between job chunks and each aggregator's own
// indexes, interleaved in proportion to the weights.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shard_placement.h"
#include "xagg/errors.h"

namespace xagg {
namespace {

// Every job chunk has one (aggregator, local index), every local index below
// an aggregator's count is used exactly once, and job_chunk inverts it.
void expect_bijection(const ShardPlacement& placement) {
  std::vector<std::vector<int>> seen(placement.shards());
  for (uint32_t shard = 0; shard < placement.shards(); ++shard) seen[shard].resize(placement.shard_chunks(shard));
  for (uint32_t chunk = 0; chunk < placement.job_chunks(); ++chunk) {
    uint32_t shard = placement.shard_of(chunk);
    uint32_t local = placement.local_index(chunk);
    ASSERT_LT(shard, placement.shards());
    ASSERT_LT(local, placement.shard_chunks(shard)) << "chunk " << chunk;
    ++seen[shard][local];
    ASSERT_EQ(placement.job_chunk(shard, local), chunk);
  }
  for (uint32_t shard = 0; shard < placement.shards(); ++shard)
    for (uint32_t local = 0; local < seen[shard].size(); ++local)
      ASSERT_EQ(seen[shard][local], 1) << "aggregator " << shard << " index " << local;
}

TEST(ShardPlacement, OneAggregatorIsTheIdentity) {
  ShardPlacement placement({1}, 1000);
  expect_bijection(placement);
  EXPECT_EQ(placement.shard_chunks(0), 1000u);
  for (uint32_t chunk = 0; chunk < 1000; ++chunk) EXPECT_EQ(placement.local_index(chunk), chunk);
}

TEST(ShardPlacement, EqualWeightsDealChunksRoundRobin) {
  ShardPlacement placement({1, 1, 1, 1}, 10);
  expect_bijection(placement);
  std::vector<uint32_t> owners;
  for (uint32_t chunk = 0; chunk < 10; ++chunk) owners.push_back(placement.shard_of(chunk));
  EXPECT_EQ(owners, (std::vector<uint32_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(placement.local_index(9), 2u);
  EXPECT_EQ((std::vector<uint32_t>{placement.shard_chunks(0), placement.shard_chunks(1), placement.shard_chunks(2),
                                   placement.shard_chunks(3)}),
            (std::vector<uint32_t>{3, 3, 2, 2}));
}

// The example of docs/protocol.md section 6: weights 3, 1, 2.
TEST(ShardPlacement, WeightsInterleaveSmoothly) {
  ShardPlacement placement({3, 1, 2}, 12);
  expect_bijection(placement);
  std::vector<uint32_t> owners;
  for (uint32_t chunk = 0; chunk < 12; ++chunk) owners.push_back(placement.shard_of(chunk));
  EXPECT_EQ(owners, (std::vector<uint32_t>{0, 2, 0, 1, 2, 0, 0, 2, 0, 1, 2, 0}));
  EXPECT_EQ(placement.local_index(5), 2u);   // aggregator 0's third chunk
  EXPECT_EQ(placement.local_index(11), 5u);  // and its sixth
  EXPECT_EQ(placement.shard_chunks(0), 6u);
  EXPECT_EQ(placement.shard_chunks(1), 2u);
  EXPECT_EQ(placement.shard_chunks(2), 4u);
}

// Any run of chunks as long as the period holds each aggregator exactly its
// weight's worth: a bucket of a few periods is spread over all of them.
TEST(ShardPlacement, EveryPeriodLongRunHoldsEachAggregatorsWeight) {
  const std::vector<uint32_t> weights{5, 1, 3, 7, 2};
  ShardPlacement placement(weights, 5000);
  expect_bijection(placement);
  const uint32_t period = 18;
  for (uint32_t start = 0; start + period <= 5000; start += 7) {
    std::vector<uint32_t> counts(weights.size());
    for (uint32_t chunk = start; chunk < start + period; ++chunk) ++counts[placement.shard_of(chunk)];
    ASSERT_EQ(counts, weights) << "run from " << start;
  }
}

TEST(ShardPlacement, BijectionForManyLayouts) {
  for (uint32_t shards : {2u, 3u, 7u, 64u})
    for (uint32_t chunks : {1u, 63u, 64u, 65u, 1000u, 4099u}) {
      std::vector<uint32_t> weights;
      for (uint32_t shard = 0; shard < shards; ++shard) weights.push_back(1 + shard * 37 % 5);
      SCOPED_TRACE(std::to_string(shards) + " aggregators, " + std::to_string(chunks) + " chunks");
      expect_bijection(ShardPlacement(weights, chunks));
    }
}

TEST(ShardPlacement, RefusesBadWeights) {
  auto refusal = [](std::vector<uint32_t> weights) {
    try {
      ShardPlacement placement(std::move(weights), 100);
    } catch (const ConfigError& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal({}).find("1 to 64"), std::string::npos);
  EXPECT_NE(refusal(std::vector<uint32_t>(65, 1)).find("1 to 64"), std::string::npos);
  EXPECT_NE(refusal({1, 0}).find("aggregator 1's weight 0"), std::string::npos);
  EXPECT_NE(refusal({1001}).find("weight 1001"), std::string::npos);
}

}  // namespace
}  // namespace xagg
