// PyTorch DDP with the "xagg" backend and with xagg_torch.allreduce_hook ends
// up with the parameters of a Gloo DDP run, within the quantization bound
// (ddp_parity.py, two ranks in testbed namespaces, the real aggregator: one, or
// one co-located on every rank's host with the job sharded over both).
#include <gtest/gtest.h>

#include "cluster.h"
#include "python_rank.h"

namespace {

using namespace xagg;  // Process, wait_all, Clock (src/common/process.h)
using namespace xagg::testbed;

constexpr uint32_t kRanks = 2;

class DdpParity : public ::testing::TestWithParam<const char*> {};

TEST_P(DdpParity, XaggBackendAndHookMatchGloo) {
  ASSERT_TRUE(can_run_pytorch_tests());
  Testbed testbed("xtrain");
  testbed.up(kRanks, Layout::parse(GetParam()));
  TeardownGuard teardown(testbed);
  Cluster cluster(XAGG_BINARY, testbed);
  cluster.start_aggregator(Clock::now() + std::chrono::seconds(30));

  std::vector<Process> ranks;
  for (uint32_t rank = 0; rank < kRanks; ++rank)
    ranks.emplace_back(python_rank(testbed, DDP_PARITY_SCRIPT, rank, kRanks));
  std::vector<ProcessResult> results = wait_all(ranks, Clock::now() + std::chrono::minutes(3));
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    EXPECT_FALSE(results[rank].timed_out) << "rank " << rank << " timed out:\n" << results[rank].output;
    EXPECT_EQ(results[rank].exit_code, 0) << "rank " << rank << ":\n" << results[rank].output;
    std::cout << results[rank].output;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, DdpParity, ::testing::Values("1", "colocated"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
