// How many chunks a worker may have in flight (docs/design.md, "Congestion
// control"). Without a slot pool nothing else bounds it, and N senders with
// their whole window out overflow every queue they share (each aggregator's
// link is an N-to-1 incast point). One window, three signals:
//  - loss (TCP Reno, ATP): a frame of this rank's own lost halves it, at most
//    once per round trip, when it is congestion rather than a lossy link's:
//    while its round trips show a standing queue (TCP Veno's test), while the
//    losses exceed a tolerated fraction of its chunks (BBRv2's loss
//    threshold), or while a loss-based flow holds the queue (below);
//  - ECN (DCTCP): the aggregator echoes in a RESULT whether any share of the
//    chunk arrived with CE set; alpha follows the marked fraction of results
//    (gain 1/16 per window of results), and a marked result multiplies the
//    window by 1 - alpha/2, once per window of results;
//  - delay (Swift): this rank's own network round trips (chunks its share
//    completed, so no waiting for other ranks is in them): when the smallest
//    of a round trip's exceeds the smallest ever seen plus a target, the
//    window is cut in proportion to the excess, at most once per round trip.
// It opens as TCP does: by one chunk per result up to the threshold (slow
// start, only while its own round trips are recent: their delay is what
// stops it), then by one per window of results. ECN and delay keep queues
// short only among senders that react alike; a loss-based flow (TCP cubic) keeps a
// shared queue full and would starve them. So, as Copa's competitive mode,
// when not one round trip of an epoch came near the smallest, or when nearly
// every result of several windows in a row echoed CE, the queue never
// drained: marks and delay are ignored until it does, and the window is
// loss-based meanwhile. The window is the sender's alone: ranks need not agree.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>

#include "control_channel.h"

namespace xagg::worker {

class CongestionWindow {
 public:
  static constexpr double kMinimum = 8;
  static constexpr double kInitial = 64;
  // DCTCP's g: the weight of one window's marked fraction in alpha.
  static constexpr double kMarkGain = 1.0 / 16;
  // Loss on a path that neither queues nor overflows (a lossy link) is not
  // congestion, and halving on it pins the window near its minimum: with a
  // round trip that includes waiting for the slowest rank, a few percent of
  // chunks losing a frame keep Reno at about 8 chunks. So losses cut only
  // while they exceed this fraction of this rank's chunks (as BBRv2's loss
  // threshold). A chunk's DATA and RESULT cross its path's links each way:
  // at 1% loss per link 3-4% of chunks lose a frame (measured on the
  // testbed's three lossy hops: 3.9%), so up to about 2.5% per link is taken
  // as random. A queue overflowing without marks or a delay past the target
  // (one shallower than kTargetQueueing) drives the fraction past it, and
  // the window then halves as Reno's, wasting at most this fraction in resends.
  static constexpr double kLossTolerance = 0.10;
  static constexpr double kLossGain = 1.0 / 512;
  // Queueing delay a round trip may show before the window is cut: above the
  // scheduling noise of a worker's progress thread (it quantizes between
  // receives), far below the queues that overflow (tbf's 50 ms in the testbed).
  static constexpr std::chrono::microseconds kTargetQueueing{5000};
  // Slow start needs an own round trip within this many unqueued round trips
  // (base + target): older ones say nothing of the queue its doubling builds.
  static constexpr double kDelaySeenFor = 2;
  // Swift's multiplicative decrease: window *= 1 - beta * excess / delay, at most halved.
  static constexpr double kDelayBeta = 0.8;
  static constexpr double kMaxDelayCut = 0.5;
  // How long the queue must stay above the target to count as held by a loss-based flow.
  static constexpr std::chrono::milliseconds kCompetitionEpoch{100};
  // A DCTCP queue swings around the mark, so only part of a window is marked;
  // this many windows in a row marked nearly throughout mean the marks no
  // longer steer it (the base round trip cannot tell when the loss-based flow
  // was there before this rank's first sample). Half a window unmarked: it drained.
  static constexpr uint32_t kStandingMarkedWindows = 4;
  static constexpr double kStandingMarkedFraction = 0.9;
  static constexpr double kDrainedMarkedFraction = 0.5;

  explicit CongestionWindow(uint32_t limit)
      : limit_(limit), window_(std::min<double>(kInitial, limit)), threshold_(limit), round_length_(window_) {}

  uint32_t chunks() const { return static_cast<uint32_t>(window_); }
  // DCTCP's alpha: the smoothed fraction of results that echoed CE.
  double marked_fraction() const { return alpha_; }
  // True while marks and delay are ignored (a queue that never drains).
  bool competing() const { return delay_never_drains_ || marks_never_drain_; }

  // A result for a chunk in flight: whether it echoed CE and, if this rank's
  // own share completed the chunk on its first transmission, its send-to-result time.
  void on_result(Clock::time_point now, bool congestion_experienced, std::optional<Clock::duration> own_round_trip);
  // The result just passed to on_result came for a resend that replaced this
  // rank's own lost DATA or RESULT; `round_trip`: the smoothed send-to-result
  // time, the length of one loss episode.
  void on_own_loss(Clock::time_point now, Clock::duration round_trip);
  // The smoothed fraction of results whose chunk lost a frame of this rank's.
  double lost_fraction() const { return lost_fraction_; }

 private:
  // DCTCP; true if it cut the window.
  bool react_to_mark(bool congestion_experienced);
  bool delay_too_high(Clock::time_point now, Clock::duration round_trip);
  // A cut shortens the window of results for which marks are ignored too.
  void cut_to(double window) {
    threshold_ = window_ = std::max(kMinimum, window);
    marks_ignored_for_ = std::min(marks_ignored_for_, window_);
  }

  double limit_;
  double window_;
  double threshold_;
  Clock::time_point no_cut_before_{};  // loss and delay cut at most once per round trip
  double lost_fraction_ = 0;
  // DCTCP.
  double alpha_ = 1.0;            // as Linux's dctcp starts: the first marked window halves
  double marks_ignored_for_ = 0;  // results, after a cut by marks
  double round_length_;           // results per update of alpha
  uint32_t round_results_ = 0;
  uint32_t round_marked_ = 0;
  uint32_t marked_rounds_in_a_row_ = 0;
  bool marks_never_drain_ = false;
  // Delay.
  std::optional<Clock::duration> base_round_trip_;  // the smallest own round trip seen
  Clock::time_point round_end_{};                   // of the current round trip's samples (the last standing one)
  std::optional<Clock::duration> round_smallest_;   // among them
  bool queue_standing_ = false;                     // the last round trip's stood above the target
  Clock::time_point last_own_round_trip_at_{};      // when the last own round trip was measured
  Clock::time_point epoch_end_{};
  std::optional<Clock::duration> epoch_smallest_;
  bool delay_never_drains_ = false;
};

}  // namespace xagg::worker
