// How the worker's waits on its control connections pace themselves: the
// join's wait for the aggregators' starts and the connection monitors.
#pragma once

#include <algorithm>
#include <chrono>

namespace xagg::worker {

// Longest single wait for a control message, so that a loop over several
// connections sees an error from any one at once, and closing is prompt.
inline constexpr std::chrono::milliseconds kControlPoll{50};

// A join or all-reduce waiting longer than a quarter of its timeout (within
// these bounds) logs what it waits for, and again at that interval.
inline constexpr std::chrono::milliseconds kMinProgressInterval{1000};
inline constexpr std::chrono::milliseconds kMaxProgressInterval{30000};

inline std::chrono::milliseconds progress_interval(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 4, kMinProgressInterval, kMaxProgressInterval);
}

}  // namespace xagg::worker
