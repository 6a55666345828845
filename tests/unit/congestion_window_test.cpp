// The worker's congestion window (src/worker/congestion_window.h): its
// reaction to each signal, driven with synthetic results on a fake timeline.
// Its effect on real queues is tested end to end (tests/e2e/congestion_test.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>

#include "congestion_window.h"

namespace xagg::worker {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kLimit = 1536;
constexpr auto kBase = 300us;  // an idle network's round trip

// Results of one window, every `gap` apart; each marked if `marked`, each with
// this round trip (none: another rank completed the chunk).
void window_of_results(CongestionWindow& window, Clock::time_point& now, bool marked,
                       std::optional<Clock::duration> round_trip, Clock::duration gap = 10us) {
  for (uint32_t i = 0, n = window.chunks(); i < n; ++i) {
    now += gap;
    window.on_result(now, marked, round_trip);
  }
}

// Slow start is stopped by the delay of this rank's own round trips: a rank
// that measures none (ahead of the others, it completes no chunks) or none
// lately opens by one per window of results until it measures again.
TEST(CongestionWindow, SlowStartOnlyWhileOwnRoundTripsAreRecent) {
  CongestionWindow window(kLimit);
  Clock::time_point now{};
  window_of_results(window, now, false, std::nullopt);
  EXPECT_LE(window.chunks(), CongestionWindow::kInitial + 1) << "doubled without ever measuring";
  window_of_results(window, now, false, kBase);
  EXPECT_GE(window.chunks(), 2 * CongestionWindow::kInitial);
  const uint32_t measured = window.chunks();
  // A result every 1 ms without an own round trip: slow start goes on for
  // 2 x (base + target) = 10.6 ms after the last one, then pauses.
  for (int i = 0; i < 100; ++i) window.on_result(now += 1ms, false, std::nullopt);
  EXPECT_GE(window.chunks(), measured + 10);
  EXPECT_LE(window.chunks(), measured + 12) << "slow start went on without recent round trips";
}

TEST(CongestionWindow, SlowStartThenOnePerWindowUpToTheLimit) {
  CongestionWindow window(kLimit);
  Clock::time_point now{};
  EXPECT_EQ(window.chunks(), CongestionWindow::kInitial);
  window_of_results(window, now, false, kBase);
  EXPECT_EQ(window.chunks(), 2 * CongestionWindow::kInitial);
  for (int i = 0; i < 10; ++i) window_of_results(window, now, false, kBase);
  EXPECT_EQ(window.chunks(), kLimit);
  EXPECT_EQ(CongestionWindow(16).chunks(), 16u);
}

// Losses of this rank's frames up to the tolerated fraction are a lossy
// link's, not a queue's: the window keeps opening. Above it, it halves once per
// round trip (one loss episode), down to the minimum.
TEST(CongestionWindow, LossBeyondTheToleratedFractionHalvesOncePerRoundTrip) {
  CongestionWindow window(kLimit);
  Clock::time_point now{};
  // One result in twenty-five lost a frame of this rank's (4%), for 5000 results.
  for (uint32_t result = 0; result < 5000; ++result) {
    window.on_result(now += 10us, false, kBase);
    if (result % 25 == 0) window.on_own_loss(now, 5ms);
  }
  EXPECT_NEAR(window.lost_fraction(), 0.04, 0.01);
  EXPECT_EQ(window.chunks(), kLimit) << "cut by random loss";
  // Every other result lost one: the fraction passes the tolerance within a few hundred results.
  uint32_t results = 0;
  for (; window.chunks() == kLimit && results < 1000; ++results) {
    window.on_result(now += 10us, false, kBase);
    if (results % 2 == 0) window.on_own_loss(now, 5ms);
  }
  EXPECT_LT(results, 400u);
  EXPECT_GT(window.lost_fraction(), CongestionWindow::kLossTolerance);
  EXPECT_EQ(window.chunks(), kLimit / 2);
  window.on_own_loss(now + 4ms, 5ms);  // the same loss episode
  EXPECT_EQ(window.chunks(), kLimit / 2);
  window.on_own_loss(now + 6ms, 5ms);
  EXPECT_EQ(window.chunks(), kLimit / 4);
  for (int i = 0; i < 10; ++i) window.on_own_loss(now + (i + 2) * 10ms, 5ms);
  EXPECT_EQ(window.chunks(), CongestionWindow::kMinimum);
}

// DCTCP: alpha follows the marked fraction; a mark cuts by alpha/2 once per
// window of results; marks stop, the window grows again.
TEST(CongestionWindow, EcnEchoCutsByHalfTheMarkedFractionOncePerWindow) {
  CongestionWindow window(kLimit);
  Clock::time_point now{};
  EXPECT_DOUBLE_EQ(window.marked_fraction(), 1.0);
  window.on_result(now += 10us, true, std::nullopt);
  EXPECT_EQ(window.chunks(), CongestionWindow::kInitial / 2) << "alpha starts at 1: the first mark halves";
  for (uint32_t i = 1; i < CongestionWindow::kInitial / 2; ++i) window.on_result(now += 10us, true, std::nullopt);
  EXPECT_EQ(window.chunks(), CongestionWindow::kInitial / 2) << "cut twice within one window";
  for (int i = 0; i < 2; ++i) window_of_results(window, now, true, std::nullopt);
  EXPECT_EQ(window.chunks(), CongestionWindow::kMinimum);
  EXPECT_NEAR(window.marked_fraction(), 1.0, 1e-9);
  // One result in ten marked: alpha converges to 0.1, each cut takes 5%.
  CongestionWindow sparse(kLimit);
  for (uint32_t result = 0; result < 20000; ++result) sparse.on_result(now += 10us, result % 10 == 0, std::nullopt);
  EXPECT_NEAR(sparse.marked_fraction(), 0.1, 0.05);
  EXPECT_GT(sparse.chunks(), CongestionWindow::kMinimum);
  // Unmarked windows: alpha decays by 1/16 per window, the window opens by one per window.
  for (int i = 0; i < 20; ++i) window_of_results(window, now, false, std::nullopt);
  EXPECT_GT(window.chunks(), CongestionWindow::kMinimum + 10);
  EXPECT_LT(window.marked_fraction(), 0.4);
}

// Windows marked nearly throughout, several in a row: the marks no longer
// steer the queue (a loss-based flow holds it above the mark, whatever the
// round trips looked like from the start), so they are ignored, loss still
// counts, until a window mostly unmarked shows the queue drained.
TEST(CongestionWindow, YieldsOnlyToLossWhileNearlyEveryResultIsMarked) {
  CongestionWindow window(kLimit);
  Clock::time_point now{};
  for (uint32_t i = 0; i < CongestionWindow::kStandingMarkedWindows && !window.competing(); ++i) {
    window_of_results(window, now, true, std::nullopt);
  }
  ASSERT_FALSE(window.competing()) << "yielded before the marks stood for enough windows";
  window_of_results(window, now, true, std::nullopt);
  ASSERT_TRUE(window.competing());
  const uint32_t held = window.chunks();
  for (int i = 0; i < 10; ++i) window_of_results(window, now, true, std::nullopt);
  EXPECT_GT(window.chunks(), held) << "cut by marks while they stood";
  const uint32_t opened = window.chunks();
  window.on_own_loss(now += 1s, 1ms);
  EXPECT_EQ(window.chunks(), opened / 2);
  // Nine marked results in ten keep it yielding; a window mostly unmarked ends it.
  for (uint32_t result = 0; result < 20 * window.chunks(); ++result)
    window.on_result(now += 10us, result % 10 != 0, std::nullopt);
  EXPECT_TRUE(window.competing());
  window_of_results(window, now, false, std::nullopt);
  window_of_results(window, now, false, std::nullopt);
  EXPECT_FALSE(window.competing());
  const uint32_t drained = window.chunks();
  window_of_results(window, now, true, std::nullopt);
  EXPECT_LT(window.chunks(), drained) << "marks ignored after the queue drained";
}

// Swift: when the smallest own round trip of a round trip's worth exceeds
// base + target, the window is cut in proportion to the excess (at most by
// half), once per round trip; a lone late sample among prompt ones is no queue.
TEST(CongestionWindow, StandingDelayAboveTheTargetCutsOncePerRoundTrip) {
  CongestionWindow window(kLimit);
  Clock::time_point now{};
  window_of_results(window, now, false, kBase);  // learns the base, slow start to 128
  ASSERT_EQ(window.chunks(), 128u);
  for (int i = 0; i < 20; ++i) window.on_result(now += 100us, false, i == 10 ? 1s : kBase);
  EXPECT_EQ(window.chunks(), 148u) << "a lone late sample cut the window";
  // Twice the target's delay, every sample: excess / delay ~ 1/2, each cut by 0.8 / 2.
  const auto high = 2 * (kBase + CongestionWindow::kTargetQueueing);
  int cuts = 0;
  for (int i = 0; i < 300; ++i) {
    const uint32_t before = window.chunks();
    window.on_result(now += 100us, false, high);
    if (window.chunks() >= before) continue;
    if (++cuts == 1) {
      EXPECT_NEAR(window.chunks(), before * 0.6, 1.5);
    }
  }
  EXPECT_GE(cuts, 2);
  EXPECT_LE(cuts, 3) << "cut more than once per round trip (10.6 ms; 30 ms of samples)";
  // A huge delay cuts at most by half.
  CongestionWindow huge(kLimit);
  window_of_results(huge, now, false, kBase);
  for (int i = 0; i < 1000; ++i) {
    const uint32_t before = huge.chunks();
    huge.on_result(now += 1ms, false, 1s);
    if (huge.chunks() >= before) continue;
    EXPECT_EQ(huge.chunks(), before / 2);
    break;
  }
  // Results without an own round trip (other ranks completed them) say nothing about delay.
  const uint32_t quiet = window.chunks();
  for (int i = 0; i < 50; ++i) window.on_result(now += 1ms, false, std::nullopt);
  EXPECT_GT(window.chunks(), quiet);
}

// A queue that never drains below the target for a whole epoch is held by a
// loss-based flow: marks and delay are ignored (loss still counts) until a
// round trip near the base shows it drained.
TEST(CongestionWindow, YieldsOnlyToLossWhileTheQueueNeverDrains) {
  CongestionWindow window(kLimit);
  Clock::time_point now{};
  for (int i = 0; i < 10; ++i) window_of_results(window, now, false, kBase);
  ASSERT_EQ(window.chunks(), kLimit);
  // A standing queue: marked results, every own round trip above the target.
  const auto standing = kBase + CongestionWindow::kTargetQueueing + 1ms;
  for (int i = 0; i < 100 && !window.competing(); ++i) window.on_result(now += 5ms, true, standing);
  ASSERT_TRUE(window.competing()) << "an epoch without a round trip near the base";
  const uint32_t held = window.chunks();
  ASSERT_GT(held, 2 * CongestionWindow::kMinimum);
  window_of_results(window, now, true, standing, 100us);
  EXPECT_GE(window.chunks(), held) << "cut by marks or delay while a loss-based flow holds the queue";
  window.on_own_loss(now += 1s, 1ms);
  EXPECT_LT(window.chunks(), held) << "a single loss did not cut while competing with a loss-based flow";
  // The queue drains: the epoch that sees it ends the yielding (and the unmarked
  // window the marks' yielding), and marks count again.
  window_of_results(window, now, false, kBase);
  window.on_result(now += CongestionWindow::kCompetitionEpoch, false, kBase);
  EXPECT_FALSE(window.competing());
  const uint32_t drained = window.chunks();
  for (int i = 0; i < 2; ++i) window_of_results(window, now, true, std::nullopt);
  EXPECT_LT(window.chunks(), drained);
}

}  // namespace
}  // namespace xagg::worker
