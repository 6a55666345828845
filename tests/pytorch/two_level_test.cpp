// The "xagg" backend in two levels (two_level.py on four ranks in testbed
// namespaces: two leaf aggregators of two ranks and a root, the real daemons),
// configured through pg_options, against Gloo's results.
#include <gtest/gtest.h>

#include "cluster.h"
#include "python_rank.h"

namespace {

using namespace xagg;  // Process, wait_all, Clock (src/common/process.h)
using namespace xagg::testbed;

constexpr uint32_t kRanks = 4;

TEST(TwoLevels, AllReduceMatchesGlooThroughLeavesAndARoot) {
  ASSERT_TRUE(can_run_pytorch_tests());
  Testbed testbed("xtorch");
  testbed.up(kRanks, Layout::parse("two-level:2"));
  TeardownGuard teardown(testbed);
  Cluster cluster(XAGG_BINARY, testbed);
  cluster.start_aggregator(Clock::now() + std::chrono::seconds(30));
  std::vector<Process> ranks;
  for (uint32_t rank = 0; rank < kRanks; ++rank)
    ranks.emplace_back(python_rank(testbed, TWO_LEVEL_SCRIPT, rank, kRanks,
                                   {"--root", testbed.aggregator(2).address, "--ranks-per-leaf", "2"}));
  std::vector<ProcessResult> results = wait_all(ranks, Clock::now() + std::chrono::minutes(3));
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    std::cout << results[rank].output;
    EXPECT_FALSE(results[rank].timed_out) << "rank " << rank << " timed out";
    EXPECT_EQ(results[rank].exit_code, 0) << "rank " << rank << ":\n" << results[rank].output;
  }
  const std::string aggregators = cluster.stop_aggregator().output;
  EXPECT_NE(aggregators.find("sent_up="), std::string::npos) << "no leaf sent a share up:\n" << aggregators;
}

}  // namespace
