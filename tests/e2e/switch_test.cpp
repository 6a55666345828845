// The switch-style baseline end to end in both its shapes, on a testbed of its
// own: one `xagg switch-aggregator` serves a job of `xagg worker --backend
// switch` (256 elements x 256 slots) and then one of `--backend switch-jumbo`
// (2048 elements in jumbo frames x 32 slots); every worker verifies every
// element. Ranks of one job that disagree on the shape are refused at join.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "baselines/switch/switch_aggregator.h"
#include "cluster.h"
#include "e2e_support.h"

namespace xagg::testbed {
namespace {

constexpr uint32_t kWorkers = 4;

class SwitchBaselineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    e2e::require_root();
    bed_.up(kWorkers);
    const HostLink host = bed_.aggregator(0);
    aggregator_.emplace(ProcessSpec{.argv = {XAGG_BINARY, "switch-aggregator", "--interface", host.interface},
                                    .netns = host.netns,
                                    .output_file = std::nullopt});
    wait_for_tcp_port(host.netns, host.address, baselines::switchml::kDefaultControlPort, *aggregator_,
                      Clock::now() + std::chrono::seconds(30));
  }

  void TearDown() override {
    if (aggregator_) {
      ProcessResult result = aggregator_->terminate();
      if (HasFailure()) std::cerr << "switch aggregator output:\n" << result.output << "\n";
      aggregator_.reset();
    }
    bed_.down();
  }

  // One verifying worker per entry of `backends` (rank = index), all in one job.
  std::vector<ProcessResult> run_job(uint32_t job_id, const std::vector<std::string>& backends, uint64_t elements,
                                     uint32_t iterations) {
    std::vector<Process> workers;
    for (uint32_t rank = 0; rank < backends.size(); ++rank)
      workers.emplace_back(ProcessSpec{
          .argv = {XAGG_BINARY, "worker", "--backend", backends[rank], "--aggregator", bed_.aggregator(0).address,
                   "--job", std::to_string(job_id), "--rank", std::to_string(rank), "--world-size",
                   std::to_string(backends.size()), "--elements", std::to_string(elements), "--iterations",
                   std::to_string(iterations), "--op", "average", "--json"},
          .netns = bed_.worker(rank).netns,
          .output_file = std::nullopt});
    return wait_all(workers, Clock::now() + std::chrono::seconds(120));
  }

  Testbed bed_{"xagg-swb"};
  std::optional<Process> aggregator_;
};

TEST_F(SwitchBaselineTest, BothShapesVerifyEveryElement) {
  constexpr uint64_t kElements = 300000;  // 1172 blocks of 256 and 147 of 2048, the last ones partial
  constexpr uint32_t kIterations = 3;
  uint32_t job_id = 1;
  for (const std::string backend : {"switch", "switch-jumbo"}) {
    SCOPED_TRACE(backend);
    auto results = run_job(job_id++, std::vector<std::string>(kWorkers, backend), kElements, kIterations);
    for (uint32_t rank = 0; rank < results.size(); ++rank) {
      SCOPED_TRACE(fmt::format("rank {} output:\n{}", rank, results[rank].output));
      EXPECT_FALSE(results[rank].timed_out);
      EXPECT_EQ(results[rank].exit_code, 0);
      auto reports = worker_reports(results[rank].output);
      ASSERT_EQ(reports.size(), kIterations);
      for (const auto& report : reports) EXPECT_EQ(report.at("wrong").get<uint64_t>(), 0u) << report.dump();
    }
  }
}

// The two shapes ask for different slot counts: the second rank's join is
// refused and the job ends at once for both, instead of timing out.
TEST_F(SwitchBaselineTest, RanksOfDifferentShapesAreRefused) {
  auto results = run_job(1, {"switch", "switch-jumbo"}, 10000, 1);
  for (uint32_t rank = 0; rank < results.size(); ++rank) {
    SCOPED_TRACE(fmt::format("rank {} output:\n{}", rank, results[rank].output));
    EXPECT_FALSE(results[rank].timed_out);
    EXPECT_NE(results[rank].exit_code, 0);
  }
  // Whichever joined second is told the job's slot count.
  EXPECT_TRUE(results[0].output.find(" slots") != std::string::npos ||
              results[1].output.find(" slots") != std::string::npos);
}

}  // namespace
}  // namespace xagg::testbed
