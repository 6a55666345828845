// torch.distributed.destroy_process_group() on an "xagg" group returns in
// every state a script leaves the group in (destroy.py in testbed namespaces,
// the real aggregator): after synchronous, asynchronous, future-chained and
// failed collectives, many rounds, at 2 and 4 ranks, and after a peer died.
// A rank whose destroy hangs dumps its Python stacks and exits 1; the harness
// also fails a rank that does not end in time.
#include <gtest/gtest.h>
#include <signal.h>

#include <ostream>

#include "cluster.h"
#include "python_rank.h"

namespace {

using namespace xagg;  // Process, wait_all, Clock (src/common/process.h)
using namespace xagg::testbed;

struct DestroyCase {
  uint32_t ranks;
  uint32_t rounds;
  bool peer_dies;
};

void PrintTo(const DestroyCase& run, std::ostream* out) {
  *out << run.ranks << " ranks, " << run.rounds << " rounds" << (run.peer_dies ? ", a peer dies" : "");
}

class Destroy : public ::testing::TestWithParam<DestroyCase> {};

TEST_P(Destroy, ReturnsInEveryState) {
  ASSERT_TRUE(can_run_pytorch_tests());
  const DestroyCase& run = GetParam();
  Testbed testbed("xtorch");
  testbed.up(run.ranks, Layout::parse("1"));
  TeardownGuard teardown(testbed);
  Cluster cluster(XAGG_BINARY, testbed);
  cluster.start_aggregator(Clock::now() + std::chrono::seconds(30));
  std::vector<Process> ranks;
  for (uint32_t rank = 0; rank < run.ranks; ++rank) {
    std::vector<std::string> arguments = {"--rounds", std::to_string(run.rounds)};
    if (run.peer_dies) arguments.push_back("--peer-dies");
    ranks.emplace_back(python_rank(testbed, DESTROY_SCRIPT, rank, run.ranks, arguments));
  }
  std::vector<ProcessResult> results = wait_all(ranks, Clock::now() + std::chrono::minutes(4));
  for (uint32_t rank = 0; rank < run.ranks; ++rank) {
    const ProcessResult& result = results[rank];
    std::cout << result.output;
    EXPECT_FALSE(result.timed_out) << "rank " << rank << " timed out:\n" << result.output;
    const bool victim = run.peer_dies && rank == run.ranks - 1;
    EXPECT_EQ(result.exit_code, victim ? 128 + SIGKILL : 0) << "rank " << rank << ":\n" << result.output;
  }
  cluster.stop_aggregator();
}

INSTANTIATE_TEST_SUITE_P(States, Destroy,
                         ::testing::Values(DestroyCase{2, 24, false}, DestroyCase{4, 12, false},
                                           DestroyCase{2, 4, true}, DestroyCase{4, 4, true}),
                         [](const ::testing::TestParamInfo<DestroyCase>& info) {
                           return std::to_string(info.param.ranks) + "Ranks" + std::to_string(info.param.rounds) +
                                  "Rounds" + (info.param.peer_dies ? "PeerDies" : "");
                         });

}  // namespace
