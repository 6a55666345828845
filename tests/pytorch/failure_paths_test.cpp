// Every failure reaches a torch.distributed caller of the "xagg" backend on
// every path: failure_paths.py on three ranks in testbed namespaces, with the
// real aggregator, meets a killed rank, a stalled rank and a killed aggregator;
// each surviving rank requires every path to raise an error naming the cause
// within the group's timeout (plus a margin), and a stalled join and collective
// to log progress lines naming the rank they wait for.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "cluster.h"
#include "python_rank.h"

namespace {

using namespace xagg;  // Process, wait_all, Clock (src/common/process.h)
using namespace xagg::testbed;

constexpr uint32_t kRanks = 3;
constexpr uint32_t kVictim = kRanks - 1;
constexpr int kTimeoutSeconds = 4;

class FailurePaths : public ::testing::TestWithParam<const char*> {};

bool all_ready(std::span<Process> ranks) {
  for (const Process& rank : ranks)
    if (rank.output().find("READY") == std::string::npos) return false;
  return true;
}

bool has_line_with(const std::string& output, const std::string& first, const std::string& second) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);)
    if (line.find(first) != std::string::npos && line.find(second) != std::string::npos) return true;
  return false;
}

TEST_P(FailurePaths, EveryPathRaisesNamingTheCause) {
  ASSERT_TRUE(can_run_pytorch_tests());
  const std::string fault = GetParam();
  Testbed testbed("xtorch");
  testbed.up(kRanks, Layout::parse("1"));
  TeardownGuard teardown(testbed);
  Cluster cluster(XAGG_BINARY, testbed);
  cluster.start_aggregator(Clock::now() + std::chrono::seconds(30));
  TempDirectory scratch("xagg-failure-paths");
  const std::filesystem::path go_file = scratch.path() / "go";

  std::vector<Process> ranks;
  for (uint32_t rank = 0; rank < kRanks; ++rank)
    ranks.emplace_back(python_rank(testbed, FAILURE_PATHS_SCRIPT, rank, kRanks,
                                   {"--fault", fault, "--timeout-s", std::to_string(kTimeoutSeconds), "--go-file",
                                    go_file.string()}));
  if (fault == "aggregator-killed") {
    const auto ready_by = Clock::now() + std::chrono::minutes(2);
    while (!all_ready(ranks) && Clock::now() < ready_by) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(all_ready(ranks)) << "the ranks never got ready:\n" << ranks[0].output();
    ASSERT_EQ(::kill(cluster.aggregator_pid(), SIGKILL), 0);
    std::ofstream{go_file};
  }
  // The stalled victim waits to be ended: only the survivors are waited for.
  std::span<Process> survivors(ranks.data(), fault == "rank-stalled" ? kVictim : kRanks);
  std::vector<ProcessResult> results = wait_all(survivors, Clock::now() + std::chrono::minutes(3));
  for (uint32_t rank = 0; rank < results.size(); ++rank) {
    const ProcessResult& result = results[rank];
    std::cout << result.output;
    EXPECT_FALSE(result.timed_out) << "rank " << rank << " timed out:\n" << result.output;
    if (fault == "rank-killed" && rank == kVictim) {
      EXPECT_EQ(result.exit_code, 128 + SIGKILL) << result.output;
      continue;
    }
    EXPECT_EQ(result.exit_code, 0) << "rank " << rank << ":\n" << result.output;
    if (fault == "rank-stalled") {
      EXPECT_TRUE(has_line_with(result.output, "to join aggregator", "for ranks " + std::to_string(kVictim)))
          << "rank " << rank << " logged no join progress line naming rank " << kVictim << ":\n" << result.output;
      EXPECT_TRUE(has_line_with(result.output, "still running after",
                                "did not contribute: " + std::to_string(kVictim)))
          << "rank " << rank << " logged no progress line naming rank " << kVictim << ":\n" << result.output;
    }
  }
  cluster.stop_aggregator();
}

INSTANTIATE_TEST_SUITE_P(Faults, FailurePaths, ::testing::Values("rank-killed", "rank-stalled", "aggregator-killed"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           std::erase(name, '-');
                           return name;
                         });

}  // namespace
