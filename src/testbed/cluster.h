// Runs an all-reduce job on a testbed: one aggregator daemon (or TCP
// parameter server) in every aggregator namespace of its layout, or no server
// for Gloo, and one verifying `xagg worker` per worker namespace. Shared by the
// demo, the end-to-end tests and the benchmarks.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "process.h"
#include "testbed.h"

namespace xagg::testbed {

// What serves the workers: the XAgg daemon with either engine, the TCP
// parameter-server baseline, the switch-style (SwitchML) baseline with
// SwitchML's packets and pool (Switch) or XAgg's packet size and the same
// bytes in flight (SwitchJumbo), or nothing: Gloo's ring runs between the
// workers. XdpTxResults: the XDP daemon with --no-result-fan-out.
enum class AggregatorKind { Xdp, XdpTxResults, Userspace, TcpPs, Switch, SwitchJumbo, Gloo };

// The backend (`xagg worker --backend`, backends::BackendConfig::name) of the workers a kind serves.
std::string backend_of(AggregatorKind kind);

struct JobSpec {
  uint32_t workers = 2;
  uint64_t elements = 1024;
  uint32_t iterations = 1;
  std::string dtype = "float32";  // or int32
  std::string op = "sum";         // or average
  std::string collective = "allreduce";  // or reduce-scatter (`xagg worker --collective`)
  uint32_t job_id = 1;
  uint64_t seed = 1;
  std::string magnitudes = "stable";  // float32: or random (`xagg worker --magnitudes`)
  std::map<uint32_t, uint32_t> start_delay_ms;  // rank -> delay before joining
  std::vector<uint32_t> aggregator_weights;     // each aggregator's share of the job; empty: equal
  uint32_t wire_bits = 32;  // bits per element on the wire (`xagg worker --wire-bits`): 16 for xagg and gloo
};

class Cluster {
 public:
  // xagg_binary: the `xagg` executable that runs the aggregator and the workers.
  Cluster(std::filesystem::path xagg_binary, const Testbed& testbed);

  // Starts one server per aggregator host of the testbed, each in its host's
  // namespace, and returns once every control port accepts. The switch
  // baseline models one switch and runs on aggregator 0 only; for Gloo it
  // starts nothing and only selects the workers' backend.
  void start_aggregator(Clock::time_point deadline, AggregatorKind kind = AggregatorKind::Xdp);
  // The XAgg daemons' --results from the next start on: "auto" (the default),
  // "broadcast", "unicast" or "multicast" (to the testbed's groups, kMulticastGroupBase).
  void set_result_mode(std::string mode) { result_mode_ = std::move(mode); }
  // The workers' --aggregator-dead-after-ms from the next run on; 0: their
  // default. Where the testbed drops packets, TCP retransmissions (200 ms and
  // up, doubling) also delay the heartbeats' answers past the default 500 ms.
  void set_aggregator_dead_after(std::chrono::milliseconds after) { aggregator_dead_after_ = after; }
  // Stops them all with SIGTERM (SIGKILL after a grace period). The result is
  // the first failure's exit code (0 when none failed), timed_out if any was
  // killed, and their outputs concatenated; a no-op without servers.
  ProcessResult stop_aggregator();
  // True only while every server runs.
  bool aggregator_running();
  // The servers' process ids in aggregator order, for CPU accounting; empty without any.
  std::vector<pid_t> aggregator_pids() const;
  // The first server's process id; -1 without one.
  pid_t aggregator_pid() const { return aggregators_.empty() ? -1 : aggregators_.front().pid(); }
  // What the servers have printed so far, concatenated (each under "--- aggregator k ---" when several).
  std::string aggregator_output() const;

  // Where a job's ranks find the servers of the kind started last: every
  // server's address in aggregator order; on a two-level layout XAgg's ranks
  // get the leaves' and the last as their root (the baselines shard over all).
  struct JobServers {
    std::string backend;  // `xagg worker --backend` / backends::BackendConfig::name
    std::vector<std::string> servers;
    std::string root;  // two-level XAgg: the root aggregator; else empty
    uint32_t ranks_per_leaf = 0;
    uint16_t port = 0;  // their control / service port
  };
  JobServers job_servers(uint32_t workers) const;

  // Runs one worker per rank, using the backend of the kind started last, until
  // all exit, the deadline passes or `cancelled` is true. Gloo's ranks meet in a
  // fresh directory that is removed afterwards, and each binds its own address.
  // Every worker gets job_servers().
  std::vector<ProcessResult> run_workers(const JobSpec& job, Clock::time_point deadline,
                                         const std::function<bool()>& cancelled = {});

 private:
  // The aggregator hosts that run a server of the current kind.
  std::vector<HostLink> server_hosts() const;

  std::filesystem::path binary_;
  const Testbed& testbed_;
  std::vector<Process> aggregators_;  // one per server host, in aggregator order
  AggregatorKind kind_ = AggregatorKind::Xdp;
  std::string result_mode_ = "auto";
  std::chrono::milliseconds aggregator_dead_after_{0};
};

// The JSON objects a `xagg worker --json` printed, one per iteration, in order.
std::vector<nlohmann::json> worker_reports(const std::string& output);

}  // namespace xagg::testbed
