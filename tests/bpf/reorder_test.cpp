// Duplicated, reordered and late packets, as a lossy network with retransmitting
// workers delivers them: every share is counted once, every chunk of every
// iteration completes exactly once with the exact sum, and late copies are
// answered from the cache or dropped, never added.
#include <algorithm>
#include <map>
#include <random>

#include "aggregator_fixture.h"

namespace xagg::dataplane::bpf_test {
namespace {

constexpr uint32_t kWorld = 4;
constexpr uint32_t kIterations = 12;

Values sum_over_ranks(uint32_t iteration) {
  Values sum(wire::kChunkElems);
  for (uint32_t rank = 0; rank < kWorld; ++rank) {
    Values one = share(rank, iteration);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += one[i];
  }
  return sum;
}

struct Send {
  uint32_t rank, chunk, iteration;
};

TEST_F(AggregatorTest, DuplicatedAndReorderedPacketsCountOnce) {
  add_job(kWorld);
  std::mt19937 random(42);
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> broadcasts;  // (iteration, chunk) -> RESULT broadcasts
  uint64_t wrong_results = 0, resends = 0, late_copies = 0;
  for (uint32_t iteration = 0; iteration < kIterations; ++iteration) {
    // Every share of this iteration one to three times, plus late copies of
    // the two previous iterations (a retransmission still in flight), all shuffled.
    std::vector<Send> sends;
    for (uint32_t rank = 0; rank < kWorld; ++rank)
      for (uint32_t chunk = 0; chunk < kChunks; ++chunk) {
        for (uint32_t copy = std::uniform_int_distribution<uint32_t>(1, 3)(random); copy > 0; --copy)
          sends.push_back({rank, chunk, iteration});
        for (uint32_t back : {1u, 2u})
          if (iteration >= back && random() % 4 == 0) sends.push_back({rank, chunk, iteration - back});
      }
    std::shuffle(sends.begin(), sends.end(), random);
    for (const Send& send : sends) {
      RunResult result = run(data(send.rank, send.chunk, send.iteration));
      if (send.iteration != iteration) ++late_copies;
      if (result.verdict != XDP_TX) {
        EXPECT_EQ(result.verdict, XDP_DROP);
        continue;
      }
      auto decoded = wire::decode_packet(std::as_bytes(std::span(result.out).subspan(kXaggOffset)));
      ASSERT_TRUE(decoded.header);
      EXPECT_EQ(decoded.header->iteration, send.iteration);
      if (decoded.header->flags & XAGG_FLAG_RESEND)
        ++resends;
      else
        ++broadcasts[{send.iteration, send.chunk}];
      if (payload_of(result.out) != sum_over_ranks(send.iteration)) ++wrong_results;
    }
  }
  EXPECT_EQ(wrong_results, 0u);
  EXPECT_EQ(broadcasts.size(), size_t{kIterations} * kChunks) << "a chunk never completed";
  for (const auto& [key, count] : broadcasts)
    EXPECT_EQ(count, 1u) << "iteration " << key.first << " chunk " << key.second << " completed " << count << " times";
  CounterRow counters = job_counters();
  EXPECT_EQ(counters[XAGG_CNT_COMPLETED], uint64_t{kIterations} * kChunks);
  EXPECT_EQ(counters[XAGG_CNT_AGGREGATED], uint64_t{kIterations} * kChunks * (kWorld - 1));
  EXPECT_EQ(counters[XAGG_CNT_RESENT], resends);
  EXPECT_GT(resends, 0u);
  EXPECT_GT(late_copies, 0u);
  EXPECT_GT(counters[XAGG_CNT_STALE], 0u) << "copies two iterations late must find the cell reused";
  EXPECT_GT(counters[XAGG_CNT_DUPLICATE], 0u);
}

}  // namespace
}  // namespace xagg::dataplane::bpf_test
