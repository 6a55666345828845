// Every collective of the "xagg" backend against Gloo's result (collectives.py
// on three ranks in testbed namespaces, the real aggregator), on links with an
// MTU of 1500: 360-element chunks, where the other PyTorch tests run at 9000.
#include <gtest/gtest.h>

#include "cluster.h"
#include "python_rank.h"

namespace {

using namespace xagg;  // Process, wait_all, Clock (src/common/process.h)
using namespace xagg::testbed;

constexpr uint32_t kRanks = 3;

TEST(Collectives, MatchGlooWithinTheQuantizationBound) {
  ASSERT_TRUE(can_run_pytorch_tests());
  Testbed testbed("xtorch");
  testbed.up(kRanks, Layout::parse("1"), 1500);
  TeardownGuard teardown(testbed);
  Cluster cluster(XAGG_BINARY, testbed);
  cluster.start_aggregator(Clock::now() + std::chrono::seconds(30));
  std::vector<Process> ranks;
  for (uint32_t rank = 0; rank < kRanks; ++rank) ranks.emplace_back(python_rank(testbed, COLLECTIVES_SCRIPT, rank, kRanks));
  std::vector<ProcessResult> results = wait_all(ranks, Clock::now() + std::chrono::minutes(3));
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    std::cout << results[rank].output;
    EXPECT_FALSE(results[rank].timed_out) << "rank " << rank << " timed out";
    EXPECT_EQ(results[rank].exit_code, 0) << "rank " << rank << ":\n" << results[rank].output;
    // XAGG_LOG_LEVEL unset: warnings and errors only, libxagg's join line included.
    EXPECT_EQ(results[rank].output.find("[info] xagg: job"), std::string::npos) << results[rank].output;
  }
  cluster.stop_aggregator();
}

}  // namespace
