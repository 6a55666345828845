// The daemon's Prometheus endpoint: GET /metrics (text exposition format
// 0.0.4) and GET /healthz, served on an address of the operator's choice by a
// thread of its own. The control loop renders the text (it owns the state)
// and publishes it; a scrape returns the latest, at most a refresh old.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "dataplane.h"
#include "link_stats.h"

namespace httplib {
class Server;
}

namespace xagg::control {

// What the control plane counts since the daemon started.
struct ControlCounters {
  uint64_t connections_accepted = 0;
  uint64_t connections_closed_idle = 0;      // no join in time
  uint64_t connections_closed_flooding = 0;  // replies left unread
  uint64_t joins_accepted = 0;
  uint64_t joins_refused = 0;
  uint64_t joins_unauthenticated = 0;  // without a valid proof of the cluster secret
  uint64_t jobs_created = 0;
  uint64_t jobs_completed = 0;  // every rank left
  uint64_t jobs_aborted = 0;    // a rank disconnected without leaving
};

struct MetricsState {
  double uptime_seconds = 0;
  uint64_t connections_open = 0;
  uint64_t jobs = 0;
  uint64_t ranks = 0;  // members of live jobs
  uint64_t memory_used_bytes = 0;
  uint64_t memory_quota_bytes = 0;
  ControlCounters control;
  dataplane::CounterSnapshot packets;  // live jobs and packets of no job
  dataplane::CounterRow ended_jobs_packets{};  // jobs removed since the start
  std::optional<dataplane::ProgramRunStats> program;  // the XDP engine's
  std::string interface;                              // the aggregator's, and its kernel counters
  dataplane::LinkCounters link;                       // empty when they could not be read
};

// The text exposition: monotonic totals (live, ended and job-less packets
// together, by outcome) and per live job, control-plane counters, gauges.
std::string render_metrics(const MetricsState& state);

class MetricsServer {
 public:
  // Listens at once; throws std::runtime_error naming the address if it cannot.
  MetricsServer(in_addr address, uint16_t port);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  void publish(std::string text);

 private:
  std::unique_ptr<httplib::Server> server_;
  std::mutex mutex_;
  std::string text_;
  std::thread thread_;
};

}  // namespace xagg::control
