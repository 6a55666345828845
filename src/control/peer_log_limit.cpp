#include "peer_log_limit.h"

#include <fmt/format.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "inet.h"

namespace xagg::control {
namespace {

using Clock = std::chrono::steady_clock;

thread_local std::optional<uint32_t> current_peer;  // s_addr of the peer whose lines these are

}  // namespace

class LimitingSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  LimitingSink(std::vector<spdlog::sink_ptr> sinks, std::string logger_name)
      : sinks_(std::move(sinks)), logger_name_(std::move(logger_name)) {}

  // Reports counts held for kReportEvery (or, with `all`, every count).
  void report_suppressed(bool all) {
    std::lock_guard lock(mutex_);
    const auto now = Clock::now();
    for (auto it = buckets_.begin(); it != buckets_.end();) {
      Bucket& bucket = it->second;
      refill(bucket, now);
      if (bucket.suppressed > 0 && (all || now - bucket.first_suppressed >= PeerLogLimit::kReportEvery))
        report(it->first, bucket, now);
      // A full bucket with nothing to report is the state a new peer starts in.
      it = bucket.suppressed == 0 && bucket.tokens >= PeerLogLimit::kBurst ? buckets_.erase(it) : std::next(it);
    }
  }

  uint64_t suppressed_total() {
    std::lock_guard lock(mutex_);
    return suppressed_total_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    if (current_peer) {
      const auto now = Clock::now();
      Bucket& bucket = buckets_.try_emplace(*current_peer, Bucket{PeerLogLimit::kBurst, now}).first->second;
      refill(bucket, now);
      if (bucket.tokens < 1) {
        if (bucket.suppressed++ == 0) bucket.first_suppressed = now;
        ++suppressed_total_;
        return;
      }
      bucket.tokens -= 1;
    }
    forward(message);
  }

  void flush_() override {
    for (const spdlog::sink_ptr& sink : sinks_) sink->flush();
  }

  // The logger's formatter (e.g. the JSON one) reaches the sinks that write.
  void set_formatter_(std::unique_ptr<spdlog::formatter> formatter) override {
    for (const spdlog::sink_ptr& sink : sinks_) sink->set_formatter(formatter->clone());
  }
  void set_pattern_(const std::string& pattern) override {
    for (const spdlog::sink_ptr& sink : sinks_) sink->set_pattern(pattern);
  }

 private:
  struct Bucket {
    double tokens;
    Clock::time_point refilled_at;
    uint64_t suppressed = 0;
    Clock::time_point first_suppressed{};
  };

  static void refill(Bucket& bucket, Clock::time_point now) {
    const double seconds = std::chrono::duration<double>(now - bucket.refilled_at).count();
    bucket.tokens = std::min(PeerLogLimit::kBurst, bucket.tokens + seconds * PeerLogLimit::kLinesPerSecond);
    bucket.refilled_at = now;
  }

  void report(uint32_t peer, Bucket& bucket, Clock::time_point now) {
    const std::string text = fmt::format(
        "{} log lines caused by {} suppressed in the last {:.1f} s (at most {} lines/s per peer, bursts of {})",
        bucket.suppressed, to_string(in_addr{peer}), std::chrono::duration<double>(now - bucket.first_suppressed).count(),
        PeerLogLimit::kLinesPerSecond, PeerLogLimit::kBurst);
    bucket.suppressed = 0;
    forward(spdlog::details::log_msg(logger_name_, spdlog::level::warn, text));
  }

  void forward(const spdlog::details::log_msg& message) {
    for (const spdlog::sink_ptr& sink : sinks_)
      if (sink->should_log(message.level)) sink->log(message);
  }

  const std::vector<spdlog::sink_ptr> sinks_;
  const std::string logger_name_;
  std::map<uint32_t, Bucket> buckets_;  // by peer address
  uint64_t suppressed_total_ = 0;
};

PeerLogLimit::PeerLogLimit() {
  auto logger = spdlog::default_logger();
  replaced_ = logger->sinks();
  sink_ = std::make_shared<LimitingSink>(replaced_, logger->name());
  logger->sinks().assign({sink_});
}

PeerLogLimit::~PeerLogLimit() {
  sink_->report_suppressed(true);
  spdlog::default_logger()->sinks() = replaced_;
}

PeerLogLimit::Scope::Scope(in_addr peer) : outer_(current_peer) { current_peer = peer.s_addr; }
PeerLogLimit::Scope::~Scope() { current_peer = outer_; }

void PeerLogLimit::report_suppressed() { sink_->report_suppressed(false); }
uint64_t PeerLogLimit::suppressed_total() const { return sink_->suppressed_total(); }

}  // namespace xagg::control
