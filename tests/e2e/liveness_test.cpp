// Liveness of the aggregator over a lossy control path (src/common/peer_liveness.h,
// docs/reliability.md): with the default aggregator_dead_after (500 ms) and one
// aggregator, a job whose every link loses kLoss of its wire frames each way
// (its control connections' too) completes with every element right; on the
// same lossy testbed a cut link and a stopped aggregator are still found
// within the bounds the liveness rule states. No mocks: the real daemon,
// `xagg worker` ranks and the testbed's per-frame loss.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <regex>
#include <thread>
#include <vector>

#include "e2e_support.h"
#include "peer_liveness.h"

namespace xagg::e2e {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

constexpr double kLoss = 0.03;  // per wire frame, each direction of every link: a rank's path crosses two
constexpr uint32_t kMtu = 1500;
constexpr uint32_t kWorkers = 4;
constexpr uint32_t kJob = 1;
constexpr milliseconds kDeadAfter{500};  // CommunicatorConfig's default, which the ranks keep
// One monitor poll (50 ms) and scheduling on two shared vCPUs.
constexpr milliseconds kSlack{250};
// A control connection's retransmission timeout on this path (200 ms minimum, linear for thin streams).
constexpr milliseconds kLateAnswer{400};

class LivenessTest : public OwnTestbedTest<> {
 protected:
  LivenessTest() : OwnTestbedTest("xagg-live") {}

  // The lossy testbed and its aggregator; the ranks keep their default dead_after.
  void start_lossy() {
    require_root();
    bed_.up(kWorkers, {}, kMtu);
    loss_.emplace(bed_, kWorkers, kLoss);
    cluster_.start_aggregator(Clock::now() + 30s);
  }

  // A job far longer than the test: it runs until the aggregator is lost.
  std::vector<Process> start_endless_job() {
    std::vector<Process> ranks;
    for (uint32_t rank = 0; rank < kWorkers; ++rank)
      ranks.emplace_back(
          ProcessSpec{.argv = {XAGG_BINARY, "worker", "--aggregator", bed_.aggregator(0).address, "--job",
                               std::to_string(kJob), "--rank", std::to_string(rank), "--world-size",
                               std::to_string(kWorkers), "--elements", "100000", "--iterations", "1000000", "--json"},
                      .netns = bed_.worker(rank).netns,
                      .output_file = std::nullopt});
    return ranks;
  }

  // Runs a job under loss for a while, applies `fail` and returns how long
  // after it each rank logged the aggregator dead; every rank must fail with
  // the error of a job left without aggregators.
  std::vector<double> detection_after(const std::function<void()>& fail) {
    std::vector<Process> ranks = start_endless_job();
    const auto running_by = Clock::now() + 60s;
    while (Clock::now() < running_by && !std::ranges::all_of(ranks, [](const Process& rank) {
             return !testbed::worker_reports(rank.output()).empty();
           }))
      std::this_thread::sleep_for(10ms);
    // Seconds of heartbeats under loss first: the excuses must not hide what follows.
    std::this_thread::sleep_for(3s);
    for (const Process& rank : ranks) EXPECT_TRUE(lines_with(rank.output(), "is dead (").empty()) << rank.output();
    const auto failed_at = WallClock::now();
    fail();
    const auto results = wait_all(ranks, Clock::now() + 30s);
    const std::string expected = fmt::format("job {}: aggregator {} failed and no aggregator of the job is left", kJob,
                                             bed_.aggregator(0).address);
    std::vector<double> detection_ms;
    for (const ProcessResult& result : results) {
      EXPECT_FALSE(result.timed_out) << result.output;
      EXPECT_NE(result.exit_code, 0) << result.output;
      EXPECT_FALSE(lines_with(result.output, expected).empty()) << result.output;
      const auto dead = lines_with(result.output, "is dead (");
      if (dead.empty()) continue;
      if (auto detected = log_time(dead.front()))
        detection_ms.push_back(std::chrono::duration<double, std::milli>(*detected - failed_at).count());
      std::cout << dead.front() << "\n";
    }
    EXPECT_EQ(detection_ms.size(), kWorkers);
    return detection_ms;
  }
};

// The longest silence each rank's log reports as excused by TCP's loss repair.
std::vector<uint64_t> excused_silences_ms(const std::vector<ProcessResult>& results) {
  std::vector<uint64_t> longest;
  const std::regex excused("answered after (\\d+) ms of silence");
  for (const ProcessResult& result : results) {
    uint64_t rank_longest = 0;
    for (const std::string& line : lines_with(result.output, "ms of silence")) {
      std::smatch found;
      if (std::regex_search(line, found, excused))
        rank_longest = std::max<uint64_t>(rank_longest, std::stoull(found[1]));
    }
    longest.push_back(rank_longest);
  }
  return longest;
}

TEST_F(LivenessTest, LossyControlPathsWithTheDefaultDeadAfterEveryElementRight) {
  start_lossy();
  testbed::JobSpec job;
  job.workers = kWorkers;
  job.elements = 200'000;
  job.iterations = 40;
  const auto results = cluster_.run_workers(job, Clock::now() + 300s);
  expect_every_element_verified(results, job.iterations);
  for (const ProcessResult& result : results) EXPECT_TRUE(lines_with(result.output, "is dead (").empty());
  const testbed::LossCounters counters = loss_->counters();
  EXPECT_NEAR(counters.rate(), kLoss, 0.005) << counters.dropped << " of " << counters.seen;
  std::cout << fmt::format("{} of {} frames lost ({:.2f}%); longest excused silence per rank (ms): {}\n",
                           counters.dropped, counters.seen, 100 * counters.rate(),
                           fmt::join(excused_silences_ms(results), ", "));
}

// Nothing crosses the aggregator's link any more: its TCP falls silent with
// the cut, which a lossy path excuses for kLossyPathFactor x dead_after at
// most (a path without loss for dead_after: failover_test.cpp).
TEST_F(LivenessTest, ACutLinkIsFoundWithinTwiceDeadAfter) {
  start_lossy();
  const testbed::HostLink link = bed_.aggregator(0);
  const auto detection = detection_after([&] {
    run_command({"ip", "-n", link.bridge_netns, "link", "set", link.bridge_port, "down"});
  });
  const milliseconds bound = PeerLiveness::kLossyPathFactor * kDeadAfter + kSlack;
  for (double ms : detection) EXPECT_LT(ms, bound.count()) << "a cut link found after " << ms << " ms";
  std::cout << fmt::format("cut link found after (ms): {:.0f}\n", fmt::join(detection, ", "));
}

// A stopped aggregator's kernel still acknowledges the pings: on a lossy
// path that cannot be told from its TCP retransmitting the answers, and is
// excused up to the hard limit, kMaxSilencePerDeadAfter x dead_after.
TEST_F(LivenessTest, AStoppedAggregatorIsFoundWithinTheHardLimit) {
  start_lossy();
  const pid_t aggregator = cluster_.aggregator_pid();
  const auto detection = detection_after([&] { ASSERT_EQ(::kill(aggregator, SIGSTOP), 0); });
  ::kill(aggregator, SIGCONT);  // so that it can stop
  // The silence counts from the last answer heard, and one sent just before the
  // stop and lost still arrives after it, by its kernel's retransmission (one
  // RTO of at least 200 ms later): the bound allows for one such answer.
  const milliseconds bound = PeerLiveness::kMaxSilencePerDeadAfter * kDeadAfter + kLateAnswer + kSlack;
  for (double ms : detection) EXPECT_LT(ms, bound.count()) << "a stopped aggregator found after " << ms << " ms";
  std::cout << fmt::format("stopped aggregator found after (ms): {:.0f}\n", fmt::join(detection, ", "));
}

}  // namespace
}  // namespace xagg::e2e
