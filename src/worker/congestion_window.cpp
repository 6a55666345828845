#include "congestion_window.h"

#include <algorithm>

namespace xagg::worker {

void CongestionWindow::on_result(Clock::time_point now, bool congestion_experienced,
                                 std::optional<Clock::duration> own_round_trip) {
  lost_fraction_ *= 1 - kLossGain;
  bool cut = react_to_mark(congestion_experienced);
  if (own_round_trip && delay_too_high(now, *own_round_trip)) cut = true;
  if (own_round_trip) last_own_round_trip_at_ = now;
  if (cut) return;
  // Slow start doubles the window each round trip, which only a delay signal
  // stops before the queue overflows; a rank with no recent round trips of its
  // own (ahead of the others, it completes no chunks) has none, so it opens by
  // one per window of results until it measures again.
  const bool delay_seen =
      base_round_trip_ && now - last_own_round_trip_at_ < kDelaySeenFor * (*base_round_trip_ + kTargetQueueing);
  window_ = std::min(limit_, window_ + (window_ < threshold_ && delay_seen ? 1.0 : 1.0 / window_));
}

void CongestionWindow::on_own_loss(Clock::time_point now, Clock::duration round_trip) {
  lost_fraction_ += kLossGain;
  // As TCP Veno: a loss while this rank's own round trips show a standing
  // queue is the queue overflowing; one on an empty path is the link's.
  const bool congestive = queue_standing_ || competing() || lost_fraction_ > kLossTolerance;
  if (now < no_cut_before_ || !congestive) return;
  cut_to(window_ / 2);
  no_cut_before_ = now + round_trip;
}

bool CongestionWindow::react_to_mark(bool congestion_experienced) {
  // As Linux's dctcp: a mark cuts at once (alpha as of the last round), then
  // marks are ignored for a window of results; alpha is updated per round.
  marks_ignored_for_ = std::max(0.0, marks_ignored_for_ - 1);
  const bool cut = congestion_experienced && !competing() && marks_ignored_for_ < 1;
  if (cut) {
    cut_to(window_ * (1 - alpha_ / 2));
    marks_ignored_for_ = window_;
  }
  ++round_results_;
  if (congestion_experienced) ++round_marked_;
  if (round_results_ >= round_length_) {
    const double fraction = static_cast<double>(round_marked_) / round_results_;
    alpha_ = (1 - kMarkGain) * alpha_ + kMarkGain * fraction;
    marked_rounds_in_a_row_ = fraction >= kStandingMarkedFraction ? marked_rounds_in_a_row_ + 1 : 0;
    if (marked_rounds_in_a_row_ >= kStandingMarkedWindows) marks_never_drain_ = true;
    if (fraction < kDrainedMarkedFraction) marks_never_drain_ = false;
    round_results_ = round_marked_ = 0;
    round_length_ = window_;
  }
  return cut;
}

bool CongestionWindow::delay_too_high(Clock::time_point now, Clock::duration round_trip) {
  base_round_trip_ = std::min(base_round_trip_.value_or(round_trip), round_trip);
  epoch_smallest_ = std::min(epoch_smallest_.value_or(round_trip), round_trip);
  const Clock::duration target = *base_round_trip_ + kTargetQueueing;
  if (now >= epoch_end_) {
    delay_never_drains_ = *epoch_smallest_ > target;
    epoch_smallest_.reset();
    epoch_end_ = now + kCompetitionEpoch;
  }
  // Swift reacts to every sample; here the smallest of a round trip's decides
  // (Copa's standing round trip): one late result is more often this rank's
  // own scheduling than a queue, which makes every sample late.
  round_smallest_ = std::min(round_smallest_.value_or(round_trip), round_trip);
  if (now < round_end_) return false;
  const Clock::duration standing = *round_smallest_;
  round_smallest_.reset();
  round_end_ = now + standing;
  queue_standing_ = standing > target;
  if (competing() || standing <= target || now < no_cut_before_) return false;
  const double excess = std::chrono::duration<double>(standing - target) / standing;
  cut_to(window_ * std::max(1 - kDelayBeta * excess, 1 - kMaxDelayCut));
  no_cut_before_ = now + standing;
  return true;
}

}  // namespace xagg::worker
