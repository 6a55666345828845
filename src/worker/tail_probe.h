// Loss detection in about a round trip where no later result can show a loss
// (the tail of a step), as TCP's tail loss probe (RFC 8985 section 7).
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>

#include "control_channel.h"  // Clock

namespace xagg::worker {

// The least send-to-result time seen lately: the network round trip of a
// chunk that this rank's share completed, without waiting for a slower rank
// (the smoothed time includes that wait). A minimum over the current and the
// previous window of kWindow, so that it follows a path that got slower.
class MinRoundTrip {
 public:
  static constexpr std::chrono::seconds kWindow{2};
  void sample(Clock::duration round_trip, Clock::time_point now) {
    if (now - window_start_ >= kWindow) {
      previous_ = current_;
      current_ = Clock::duration::max();
      window_start_ = now;
    }
    current_ = std::min(current_, round_trip);
  }
  std::optional<Clock::duration> get() const {
    Clock::duration least = std::min(current_, previous_);
    if (least == Clock::duration::max()) return std::nullopt;
    return least;
  }

 private:
  Clock::duration current_ = Clock::duration::max();
  Clock::duration previous_ = Clock::duration::max();
  Clock::time_point window_start_{};
};

// When to probe: once results have stopped for the probe timeout (PTO) while
// chunks are in flight, measured from the latest result or send, whichever is
// later. PTO = 2 * minimum round trip + kSlack (scheduling on a busy host),
// at most the retransmit interval (also its value before any sample). Each
// probe without a result since doubles the next wait, and after kMaxProbes
// the probe stays quiet until a result comes: a rank that waits for a slow
// rank's compute sends a few probes, not a stream.
class TailProbe {
 public:
  static constexpr Clock::duration kSlack = std::chrono::milliseconds{1};
  static constexpr int kMaxProbes = 3;
  // Chunks resent per probe, the longest-waiting ones: at a step's tail the
  // ones still in flight are the lost ones.
  static constexpr uint32_t kChunksPerProbe = 4;

  explicit TailProbe(Clock::duration ceiling) : ceiling_(ceiling) {}

  Clock::duration timeout(std::optional<Clock::duration> min_round_trip) const {
    if (!min_round_trip) return ceiling_;
    return std::min(ceiling_, 2 * *min_round_trip + kSlack);
  }
  // Null when no probe is due however long nothing happens.
  std::optional<Clock::time_point> due(std::optional<Clock::duration> min_round_trip) const {
    if (probes_ >= kMaxProbes) return std::nullopt;
    return std::max(last_result_, last_send_) + timeout(min_round_trip) * (1 << probes_);
  }
  void on_result(Clock::time_point now) {
    last_result_ = now;
    probes_ = 0;
  }
  void on_send(Clock::time_point now) { last_send_ = now; }
  void on_probe(Clock::time_point now) {
    last_send_ = now;
    ++probes_;
  }

 private:
  Clock::duration ceiling_;
  Clock::time_point last_result_{};
  Clock::time_point last_send_{};
  int probes_ = 0;
};

}  // namespace xagg::worker
