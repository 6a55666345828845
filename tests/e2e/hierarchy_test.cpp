// Two-level jobs through the real XDP data plane: leaf aggregators add their
// ranks' shares and send each completed chunk up to a root aggregator as
// their share, from XDP; the root's result comes back down through the
// leaves. Every worker verifies every element, also under loss on every link
// (both levels), in a world past the 64 ranks one aggregator takes and for a
// reduce-scatter; a killed root or leaf fails every rank with an error, never a hang.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <functional>
#include <optional>
#include <regex>
#include <thread>

#include "cluster.h"
#include "e2e_support.h"
#include "impairment.h"

namespace xagg::testbed {
namespace {

struct TwoLevelCase {
  const char* name;
  JobSpec job;
  uint32_t leaves = 0;
  double loss = 0;
};

void PrintTo(const TwoLevelCase& c, std::ostream* out) { *out << c.name; }

// The final value of `counter` in the job-end line of each aggregator, in
// aggregator order (0 where the line does not name it).
std::vector<uint64_t> final_counters(const std::string& output, uint32_t aggregators, const std::string& counter) {
  std::vector<uint64_t> values(aggregators, 0);
  for (uint32_t index = 0; index < aggregators; ++index) {
    const std::string header = fmt::format("--- aggregator {} ---", index);
    const size_t begin = output.find(header);
    if (begin == std::string::npos) continue;
    const size_t end = output.find("--- aggregator", begin + header.size());
    const std::string section = output.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    std::smatch match;
    if (std::regex_search(section, match, std::regex(" " + counter + "=(\\d+)"))) values[index] = std::stoull(match[1]);
  }
  return values;
}

class TwoLevelJobTest : public e2e::OwnTestbedTest<::testing::TestWithParam<TwoLevelCase>> {
 protected:
  TwoLevelJobTest() : OwnTestbedTest("xagg-tree") {}
};

TEST_P(TwoLevelJobTest, EveryWorkerVerifiesEveryElement) {
  const TwoLevelCase& c = GetParam();
  const uint32_t aggregators = c.leaves + 1;
  start(c.job.workers, Layout::parse(fmt::format("two-level:{}", c.leaves)), c.loss, "auto");
  auto results = cluster_.run_workers(c.job, Clock::now() + std::chrono::seconds(300));
  e2e::expect_every_element_verified(results, c.job.iterations);
  if (loss_) {
    EXPECT_GT(loss_->counters().dropped, 0u) << "the loss filters dropped nothing";
  }
  // The root ends its job (and logs its counters) once the last leaf's leave arrives.
  const auto patience = Clock::now() + std::chrono::seconds(10);
  while (final_counters(cluster_.aggregator_output(), aggregators, "completed").back() == 0 && Clock::now() < patience)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string output = cluster_.stop_aggregator().output;
  // Every leaf sent its sums up and relayed the root's results down; the root completed them.
  const auto sent_up = final_counters(output, aggregators, "sent_up");
  const auto relayed = final_counters(output, aggregators, "relayed_down");
  const auto completed = final_counters(output, aggregators, "completed");
  for (uint32_t leaf = 0; leaf + 1 < aggregators; ++leaf) {
    EXPECT_GT(sent_up[leaf], 0u) << "leaf " << leaf << ":\n" << output;
    EXPECT_GT(relayed[leaf], 0u) << "leaf " << leaf << ":\n" << output;
  }
  EXPECT_EQ(sent_up.back(), 0u) << output;
  EXPECT_GT(completed.back(), 0u) << output;
}

JobSpec of(uint32_t workers, uint64_t elements, const char* dtype, const char* op, uint32_t iterations,
           const char* magnitudes = "stable") {
  JobSpec job;
  job.workers = workers;
  job.elements = elements;
  job.dtype = dtype;
  job.op = op;
  job.iterations = iterations;
  job.magnitudes = magnitudes;
  job.job_id = 31;
  return job;
}

JobSpec reduce_scatter(JobSpec job) {
  job.collective = "reduce-scatter";
  return job;
}

INSTANTIATE_TEST_SUITE_P(
    TwoLevels, TwoLevelJobTest,
    ::testing::Values(
        TwoLevelCase{"three_leaves_of_three_float_average", of(9, 300'000, "float32", "average", 3), 3},
        TwoLevelCase{"three_leaves_of_three_int32_loss2pct", of(9, 200'000, "int32", "sum", 3), 3, 0.02},
        TwoLevelCase{"uneven_leaves_random_magnitudes_loss1pct", of(7, 150'000, "float32", "sum", 2, "random"), 3,
                     0.01},
        // Past the 64 ranks of one aggregator, with small tensors.
        TwoLevelCase{"seventy_two_ranks_in_three_leaves", of(72, 5'000, "int32", "sum", 2), 3},
        // A reduce-scatter: each rank verifies its shard (the leaves relay whole results).
        TwoLevelCase{"reduce_scatter_float_loss1pct", reduce_scatter(of(6, 6 * 40'000, "float32", "sum", 2)), 2,
                     0.01}),
    [](const auto& info) { return std::string(info.param.name); });

// A leaf or the root dies in the middle of a job: every rank of every leaf
// fails with an error (naming the dead aggregator where its own leaf saw it),
// none hangs and none reports a result it did not get.
class TwoLevelFailureTest : public e2e::OwnTestbedTest<> {
 protected:
  TwoLevelFailureTest() : OwnTestbedTest("xagg-treef") {}

  // expected_error(testbed): a text every rank's error must hold.
  void kill_mid_job(uint32_t victim, const std::function<std::string()>& expected_error) {
    JobSpec job = of(6, 400'000, "float32", "sum", 400);
    start(job.workers, Layout::parse("two-level:3"), 0, "auto");
    std::thread killer([&] {
      // Once the job runs: the ranks report their first all-reduces within a second.
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      ::kill(cluster_.aggregator_pids().at(victim), SIGKILL);
    });
    const auto begin = Clock::now();
    const auto results = cluster_.run_workers(job, Clock::now() + std::chrono::seconds(120));
    killer.join();
    for (uint32_t rank = 0; rank < results.size(); ++rank) {
      const ProcessResult& result = results[rank];
      EXPECT_FALSE(result.timed_out) << "rank " << rank << " hung:\n" << result.output;
      EXPECT_NE(result.exit_code, 0) << "rank " << rank << " finished 400 all-reduces despite the kill:\n"
                                     << result.output;
      EXPECT_LT(worker_reports(result.output).size(), job.iterations) << result.output;
      for (const auto& report : worker_reports(result.output))
        EXPECT_EQ(report.at("wrong").get<uint64_t>(), 0u) << report.dump();
    }
    // The ranks of a surviving leaf learn it from their leaf, which learns it from the root.
    const ProcessResult& first = results.front();
    EXPECT_NE(first.output.find(expected_error()), std::string::npos) << first.output;
    const size_t error_line = first.output.rfind("[error]");
    std::cout << fmt::format("every rank failed {} ms after the job started (the kill came at 1500 ms); rank 0: {}\n",
                             std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - begin).count(),
                             error_line == std::string::npos
                                 ? std::string("no error line")
                                 : first.output.substr(error_line, first.output.find('\n', error_line) - error_line));
  }
};

TEST_F(TwoLevelFailureTest, RootKilledFailsEveryRank) {
  kill_mid_job(3, [&] { return fmt::format("parent aggregator {}", bed_.aggregator(3).address); });
}

TEST_F(TwoLevelFailureTest, LeafKilledFailsEveryRank) {
  // Rank 0's leaf survives: the root aborts its job when leaf 2's connection closes.
  kill_mid_job(2, [] { return std::string("rank 2 disconnected"); });
}

}  // namespace
}  // namespace xagg::testbed
