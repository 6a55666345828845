// Per-peer limits on the daemon's log: lines logged while the control loop
// handles one peer's connection are that peer's, and each peer address may
// write kLinesPerSecond on average (bursts of kBurst). What a peer exceeds is
// dropped and counted, and the count is logged kReportEvery after the first
// line it dropped (so a peer flooding without pause costs one more line per
// kReportEvery) and when the limit is removed. Lines of no peer (start, stop,
// what other threads log) pass unlimited.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace spdlog::sinks {
class sink;
}

namespace xagg::control {

class LimitingSink;

class PeerLogLimit {
 public:
  static constexpr double kLinesPerSecond = 10;
  static constexpr double kBurst = 50;
  static constexpr std::chrono::seconds kReportEvery{10};

  // Puts itself in front of the default logger's sinks until destroyed, when
  // it reports every count it holds. Make it before other threads log
  // through that logger.
  PeerLogLimit();
  ~PeerLogLimit();
  PeerLogLimit(const PeerLogLimit&) = delete;
  PeerLogLimit& operator=(const PeerLogLimit&) = delete;

  // While one lives, this thread's log lines are `peer`'s.
  class Scope {
   public:
    explicit Scope(in_addr peer);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    std::optional<uint32_t> outer_;
  };

  // Logs the counts of peers whose lines were suppressed for kReportEvery and
  // forgets peers with nothing to report; call it periodically.
  void report_suppressed();
  uint64_t suppressed_total() const;

 private:
  std::shared_ptr<LimitingSink> sink_;
  std::vector<std::shared_ptr<spdlog::sinks::sink>> replaced_;
};

}  // namespace xagg::control
