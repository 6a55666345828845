// Failover through the real XDP data plane: an aggregator of a sharded job
// dies (SIGKILL, or its link cut) in the middle of a job of verifying
// `xagg worker` ranks, at a random point, many times. Every rank must finish
// every all-reduce with every element right (its chunks moved to the
// survivors), none may hang, and without a survivor every rank must fail with
// the same error naming the dead aggregator. Prints the measured detection
// and recovery times (docs/reliability.md, "Failover").
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <random>
#include <regex>
#include <thread>

#include "cluster.h"
#include "e2e_support.h"
#include "process.h"

namespace xagg::testbed {
namespace {

using e2e::lines_with;
using e2e::log_time;
using e2e::WallClock;
using std::chrono::milliseconds;

constexpr uint32_t kJob = 17;

struct Figures {
  std::vector<double> detection_ms;  // failure to the rank's "is dead" line
  std::vector<double> recovery_ms;   // that line to the failover's end, as the rank logs it
  void print(const char* what) const {
    auto describe = [](std::vector<double> values) {
      if (values.empty()) return std::string("none");
      std::ranges::sort(values);
      return fmt::format("median {:.0f} ms, max {:.0f} ms over {}", values[values.size() / 2], values.back(),
                         values.size());
    };
    std::cout << what << ": detection " << describe(detection_ms) << "; recovery " << describe(recovery_ms) << "\n";
  }
};

class FailoverTest : public ::testing::Test {
 protected:
  void TearDown() override {
    ProcessResult aggregators = cluster_.stop_aggregator();
    if (HasFailure()) std::cerr << "aggregator output:\n" << aggregators.output << "\n";
    bed_.down();
  }

  std::string aggregator_list(uint32_t count) const {
    std::vector<std::string> addresses;
    for (uint32_t index = 0; index < count; ++index) addresses.push_back(bed_.aggregator(index).address);
    return fmt::format("{}", fmt::join(addresses, ","));
  }

  std::vector<Process> start_ranks(uint32_t workers, const std::string& list, uint64_t elements,
                                   uint32_t iterations, uint64_t seed) {
    std::vector<Process> ranks;
    for (uint32_t rank = 0; rank < workers; ++rank)
      ranks.emplace_back(ProcessSpec{.argv = {XAGG_BINARY, "worker", "--aggregator", list, "--job",
                                              std::to_string(kJob), "--rank", std::to_string(rank), "--world-size",
                                              std::to_string(workers), "--elements", std::to_string(elements),
                                              "--iterations", std::to_string(iterations), "--seed",
                                              std::to_string(seed), "--json"},
                                     .netns = bed_.worker(rank).netns,
                                     .output_file = std::nullopt});
    return ranks;
  }

  // As root, the testbed with kWorkers workers and `aggregators` dedicated aggregators.
  void up(uint32_t aggregators) {
    e2e::require_root();
    bed_.up(kWorkers, Layout{.aggregators = aggregators, .colocated = false});
  }

  // Starts the aggregators and a job of `iterations` all-reduces on them;
  // true once it runs (every rank has reported its first all-reduce).
  bool start_job(uint32_t aggregators, uint32_t iterations, uint64_t seed, std::vector<Process>& ranks) {
    cluster_.start_aggregator(Clock::now() + std::chrono::seconds(30));
    ranks = start_ranks(kWorkers, aggregator_list(aggregators), 200'000, iterations, seed);
    return wait_until_running(ranks, Clock::now() + std::chrono::seconds(30));
  }

  // Waits until every rank has reported its first all-reduce: the job runs.
  static bool wait_until_running(std::vector<Process>& ranks, Clock::time_point deadline) {
    while (Clock::now() < deadline) {
      if (std::ranges::all_of(ranks, [](const Process& rank) { return !worker_reports(rank.output()).empty(); }))
        return true;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return false;
  }

  // Every rank completed every iteration exactly; the failover figures of
  // those that saw the failure go into `figures`. Returns whether any failed over.
  static bool check_exact(const std::vector<ProcessResult>& results, uint32_t iterations,
                          WallClock::time_point failed_at, Figures& figures) {
    bool failed_over = false;
    for (uint32_t rank = 0; rank < results.size(); ++rank) {
      const ProcessResult& result = results[rank];
      EXPECT_FALSE(result.timed_out) << "rank " << rank << " hung:\n" << result.output;
      EXPECT_EQ(result.exit_code, 0) << "rank " << rank << ":\n" << result.output;
      auto reports = worker_reports(result.output);
      EXPECT_EQ(reports.size(), iterations) << result.output;
      for (const auto& report : reports) EXPECT_EQ(report.at("wrong").get<uint64_t>(), 0u) << report.dump();
      auto dead = lines_with(result.output, "is dead (");
      auto done = lines_with(result.output, "failover to epoch");
      if (!dead.empty())
        if (auto detected = log_time(dead.front()))
          figures.detection_ms.push_back(
              std::chrono::duration<double, std::milli>(*detected - failed_at).count());
      for (const std::string& line : done) {
        std::smatch took;
        if (std::regex_search(line, took, std::regex("done (\\d+) ms after"))) {
          figures.recovery_ms.push_back(std::stod(took[1]));
          failed_over = true;
        }
      }
    }
    return failed_over;
  }

  // Runs `cycles` jobs; in each, once the job runs, waits a random time and
  // applies `fail` to a random aggregator, and `repair` to it once the job ended.
  void run_cycles(uint32_t cycles, const std::function<void(uint32_t aggregator)>& fail,
                  const std::function<void(uint32_t aggregator)>& repair, Figures& figures) {
    // Long enough that a failure up to 250 ms in lands before the last all-reduce
    // on a quiet machine too (16 took under 200 ms there).
    const uint32_t iterations = 64;
    std::mt19937 random(20261206);
    uint32_t failed_over = 0;
    const auto suite_deadline = Clock::now() + std::chrono::seconds(150);
    for (uint32_t cycle = 0; cycle < cycles && Clock::now() < suite_deadline; ++cycle) {
      std::vector<Process> ranks;
      ASSERT_TRUE(start_job(kAggregators, iterations, cycle + 1, ranks)) << ranks[0].output();
      const auto delay = milliseconds(std::uniform_int_distribution<int>(0, 250)(random));
      const uint32_t victim = std::uniform_int_distribution<uint32_t>(0, kAggregators - 1)(random);
      std::this_thread::sleep_for(delay);
      const auto failed_at = WallClock::now();
      fail(victim);
      auto results = wait_all(ranks, Clock::now() + std::chrono::seconds(60));
      const bool moved = check_exact(results, iterations, failed_at, figures);
      failed_over += moved;
      std::cout << fmt::format("cycle {}: aggregator {} failed {} ms into the job's second all-reduce; {}\n", cycle,
                               victim, delay.count(), moved ? "failed over" : "the job had ended");
      cluster_.stop_aggregator();
      repair(victim);
      if (HasFailure()) return;
    }
    // A failure after the last all-reduce tests nothing: most must land mid-job.
    EXPECT_GE(failed_over * 2, cycles) << "too few failures landed while the job ran";
  }

  static constexpr uint32_t kWorkers = 3;
  static constexpr uint32_t kAggregators = 3;
  Testbed bed_{"xagg-fo"};
  Cluster cluster_{XAGG_BINARY, bed_};
};

uint32_t cycles_from_environment(uint32_t fallback) {
  const char* text = std::getenv("XAGG_FAILOVER_CYCLES");
  return text ? static_cast<uint32_t>(std::stoul(text)) : fallback;
}

// SIGKILL: the aggregator's control connections close at once.
TEST_F(FailoverTest, AggregatorKilledAtRandomPointsEveryResultExactNothingHangs) {
  up(kAggregators);
  Figures figures;
  run_cycles(
      cycles_from_environment(20),
      [&](uint32_t victim) { ASSERT_EQ(::kill(cluster_.aggregator_pids().at(victim), SIGKILL), 0); },
      [](uint32_t) {}, figures);
  figures.print("SIGKILL");
}

// A link cut: the aggregator runs on but nothing reaches it, so only the
// heartbeats' silence (aggregator_dead_after, 500 ms) tells.
TEST_F(FailoverTest, AggregatorLinkCutAtRandomPointsEveryResultExactNothingHangs) {
  up(kAggregators);
  Figures figures;
  auto set_link = [&](uint32_t aggregator, const char* state) {
    const HostLink& link = bed_.aggregator(aggregator);
    run_command({"ip", "-n", link.bridge_netns, "link", "set", link.bridge_port, state});
  };
  run_cycles(
      cycles_from_environment(5), [&](uint32_t victim) { set_link(victim, "down"); },
      [&](uint32_t victim) { set_link(victim, "up"); }, figures);
  figures.print("link cut");
  for (double detection : figures.detection_ms) EXPECT_LT(detection, 1000) << "detection beyond 1 s";
}

// Two of three aggregators die one after the other in one job: two epochs.
TEST_F(FailoverTest, TwoAggregatorsKilledInOneJobTheLastOneCarriesIt) {
  up(kAggregators);
  const uint32_t iterations = 16;
  std::vector<Process> ranks;
  ASSERT_TRUE(start_job(kAggregators, iterations, 7, ranks)) << ranks[0].output();
  const auto failed_at = WallClock::now();
  ASSERT_EQ(::kill(cluster_.aggregator_pids().at(0), SIGKILL), 0);
  std::this_thread::sleep_for(milliseconds(150));
  ASSERT_EQ(::kill(cluster_.aggregator_pids().at(2), SIGKILL), 0);
  Figures figures;
  auto results = wait_all(ranks, Clock::now() + std::chrono::seconds(60));
  check_exact(results, iterations, failed_at, figures);
  for (const ProcessResult& result : results)
    EXPECT_FALSE(lines_with(result.output, "failover to epoch 2").empty()) << result.output;
  figures.print("two kills");
}

// A cut on one rank's path only (rank 0 and aggregator 1 drop each other's
// packets on input, by nftables in their namespaces; a drop on output would
// fail rank 0's sends at once instead): the other ranks still hear aggregator
// 1 and learn of the failure from the survivors, which forward rank 0's
// request; every rank then moves and finishes exactly.
TEST_F(FailoverTest, ACutOnOneRanksPathOnlyStillMovesEveryRank) {
  up(kAggregators);
  const uint32_t iterations = 16;
  std::vector<Process> ranks;
  ASSERT_TRUE(start_job(kAggregators, iterations, 11, ranks)) << ranks[0].output();
  auto drop_input_from = [](const std::string& netns, const std::string& source) {
    auto nft = [&](std::vector<std::string> words) {
      words.insert(words.begin(), {"ip", "netns", "exec", netns, "nft"});
      run_command(words);
    };
    nft({"add", "table", "ip", "xagg_cut"});
    nft({"add", "chain", "ip", "xagg_cut", "in", "{ type filter hook input priority 0 ; }"});
    nft({"add", "rule", "ip", "xagg_cut", "in", "ip", "saddr", source, "drop"});
  };
  const auto failed_at = WallClock::now();
  drop_input_from(bed_.worker(0).netns, bed_.aggregator(1).address);
  drop_input_from(bed_.aggregator(1).netns, bed_.worker(0).address);
  Figures figures;
  auto results = wait_all(ranks, Clock::now() + std::chrono::seconds(60));
  check_exact(results, iterations, failed_at, figures);
  for (uint32_t rank = 1; rank < kWorkers; ++rank)
    EXPECT_FALSE(lines_with(results[rank].output, "another rank's failover request").empty()) << results[rank].output;
  figures.print("one rank's path cut");
}

// One aggregator and no other: every rank fails with the same error, naming it.
TEST_F(FailoverTest, WithoutASurvivorEveryRankGetsTheSameErrorNamingTheDeadAggregator) {
  up(1);
  std::vector<Process> ranks;
  ASSERT_TRUE(start_job(1, 400, 3, ranks)) << ranks[0].output();
  const auto killed_at = Clock::now();
  ASSERT_EQ(::kill(cluster_.aggregator_pids().at(0), SIGKILL), 0);
  auto results = wait_all(ranks, Clock::now() + std::chrono::seconds(60));
  const std::string expected = fmt::format("job {}: aggregator {} failed and no aggregator of the job is left to take "
                                           "over its chunks",
                                           kJob, bed_.aggregator(0).address);
  for (const ProcessResult& result : results) {
    EXPECT_FALSE(result.timed_out) << result.output;
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_FALSE(lines_with(result.output, expected).empty()) << "expected: " << expected << "\n"
                                                                            << result.output;
  }
  std::cout << fmt::format("every rank failed {} ms after the kill\n",
                           std::chrono::duration_cast<milliseconds>(Clock::now() - killed_at).count());
}

}  // namespace
}  // namespace xagg::testbed
