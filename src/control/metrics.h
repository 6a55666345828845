// The daemon's Prometheus endpoint: GET /metrics (text exposition format
// 0.0.4) and GET /healthz, served on an address of the operator's choice by a
// thread of its own. The control loop renders the text (it owns the state)
// and publishes it; a scrape returns the latest, at most a refresh old, and
// /healthz tells whether the loop still publishes.
#pragma once

#include <netinet/in.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "dataplane.h"
#include "link_stats.h"
#include "unique_fd.h"

namespace xagg::control {

// Why a join was refused (the label of xagg_joins_refused_total).
enum class JoinRefusal {
  Invalid,          // fields out of range or inconsistent with each other
  Mtu,              // the rank's path MTU is below the floor
  Subnet,           // off the subnet that broadcast RESULTs reach
  Capacity,         // job slots, or one source's joins of jobs not started, exhausted
  Memory,           // the job's cells exceed the free memory quota
  Mismatch,         // disagrees with the job's other ranks, or a rank or connection joined twice
  Unauthenticated,  // no valid proof of the cluster secret
};
inline constexpr size_t kJoinRefusalCount = static_cast<size_t>(JoinRefusal::Unauthenticated) + 1;
const char* refusal_name(JoinRefusal reason);

// What the control plane counts since the daemon started.
struct ControlCounters {
  uint64_t connections_accepted = 0;
  uint64_t connections_closed_idle = 0;      // no join in time
  uint64_t connections_closed_flooding = 0;  // replies left unread
  uint64_t joins_accepted = 0;
  std::array<uint64_t, kJoinRefusalCount> joins_refused{};  // by JoinRefusal
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
  uint64_t log_lines_suppressed = 0;  // PeerLogLimit
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

// Serves the published text on its own thread with one epoll loop, so that
// connections cost a descriptor, never a thread: no number of idle or slow
// clients delays a scrape (a thread pool of N is starved by N idle clients).
// Every request gets an answer (404, 405 with Allow, 400, 431), every
// response closes its connection, a request has kRequestWithin to arrive,
// and at kMaxConnections the one nearest its deadline makes room for a new one.
class MetricsServer {
 public:
  static constexpr std::chrono::seconds kRequestWithin{10};
  // A quarter of the usual 1024 descriptors a process gets: metrics clients
  // cannot take the control endpoint's.
  static constexpr size_t kMaxConnections = 256;
  // /healthz answers 503 once the control loop has not published for this long.
  static constexpr std::chrono::seconds kStaleAfter{5};

  // Listens at once; throws std::runtime_error naming the address if it cannot.
  MetricsServer(in_addr address, uint16_t port);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The control loop's latest text; publishing also tells /healthz it turns.
  void publish(std::string text);

 private:
  struct Client;
  using Clock = std::chrono::steady_clock;

  void serve();
  void accept_all();
  void on_event(int fd, uint32_t events);
  void answer_with(Client& client, std::string response);
  void respond(Client& client);
  void close_client(int fd);
  void close_nearest_deadline();
  void close_expired();
  std::string answer(std::string_view request_head);

  UniqueFd listener_;
  UniqueFd epoll_;
  UniqueFd stop_;  // eventfd: the destructor wants the thread to end
  std::map<int, Client> clients_;
  std::optional<Clock::time_point> accepts_resume_at_;  // out of descriptors
  std::mutex mutex_;
  std::string text_;
  Clock::time_point published_at_;
  std::thread thread_;
};

}  // namespace xagg::control
