// A competing bulk TCP flow between two testbed hosts, the cross traffic of a
// shared link: a receiver listening in one host's namespace and a sender in
// another's that writes as fast as TCP lets it until stop(). Both run on
// threads of this process with sockets made in their namespaces (no child
// processes to leave behind); the kernel's default congestion control.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <memory>
#include <thread>
#include <vector>

#include "process.h"
#include "testbed.h"
#include "unique_fd.h"

namespace xagg::testbed {

struct FlowReport {
  uint64_t bytes = 0;    // received
  double seconds = 0;    // from connect to stop
  std::string error;     // the first socket error, if the flow broke
  double gbit() const { return seconds > 0 ? double(bytes) * 8 / seconds / 1e9 : 0; }
};

class CompetingFlow {
 public:
  // Connects from.netns to to.address (any free port) and starts sending;
  // throws std::runtime_error when the connection cannot be made.
  CompetingFlow(const HostLink& from, const HostLink& to, std::string label);
  ~CompetingFlow();  // stop()
  CompetingFlow(const CompetingFlow&) = delete;
  CompetingFlow& operator=(const CompetingFlow&) = delete;

  const std::string& label() const { return label_; }
  uint64_t bytes_received() const { return received_.load(std::memory_order_relaxed); }
  // Bytes received by `when` (sampled every kSampleInterval, interpolated
  // between samples), so that a benchmark can take the goodput over exactly
  // the window its timed iterations spanned.
  uint64_t bytes_at(Clock::time_point when) const;
  // The goodput between two instants of the flow's life, in Gbit/s.
  double gbit_between(Clock::time_point from, Clock::time_point to) const;
  static constexpr std::chrono::milliseconds kSampleInterval{5};
  // Ends both sides (the sender resets the connection, so nothing queued drains
  // afterwards) and joins their threads; later calls return the same report.
  FlowReport stop();

 private:
  void send_loop();
  void receive_loop();
  void fail(const std::string& what);

  std::string label_;
  UniqueFd sender_;
  UniqueFd receiver_;
  Clock::time_point start_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> received_{0};
  mutable std::mutex mutex_;  // error_, report_, samples_
  std::vector<std::pair<Clock::time_point, uint64_t>> samples_;  // (time, bytes received by then)
  std::string error_;
  std::optional<FlowReport> report_;
  std::thread send_thread_;
  std::thread receive_thread_;
};

}  // namespace xagg::testbed
