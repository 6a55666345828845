// Runs an all-reduce job on a testbed: the aggregator daemon (or the TCP
// parameter server) in <p>-agg, or no server for Gloo, and one verifying
// `xagg worker` per worker namespace. Shared by the demo, the end-to-end tests
// and the benchmarks.
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
// parameter-server baseline, the switch-style (SwitchML) baseline, or nothing:
// Gloo's ring runs between the workers. XdpTxResults: the XDP daemon with
// --no-result-fan-out.
enum class AggregatorKind { Xdp, XdpTxResults, Userspace, TcpPs, Switch, Gloo };

struct JobSpec {
  uint32_t workers = 2;
  uint64_t elements = 1024;
  uint32_t iterations = 1;
  std::string dtype = "float32";  // or int32
  std::string op = "sum";         // or average
  uint32_t job_id = 1;
  uint64_t seed = 1;
  std::string magnitudes = "stable";  // float32: or random (`xagg worker --magnitudes`)
  std::map<uint32_t, uint32_t> start_delay_ms;  // rank -> delay before joining
};

class Cluster {
 public:
  // xagg_binary: the `xagg` executable that runs the aggregator and the workers.
  Cluster(std::filesystem::path xagg_binary, const Testbed& testbed);

  // Starts the aggregator on the testbed and returns once its control port
  // accepts. For Gloo it starts nothing and only selects the workers' backend.
  void start_aggregator(Clock::time_point deadline, AggregatorKind kind = AggregatorKind::Xdp);
  // Stops it with SIGTERM (SIGKILL after a grace period) and returns its result; a no-op without one.
  ProcessResult stop_aggregator();
  bool aggregator_running();
  // The running aggregator's process id, for CPU accounting; -1 without one.
  pid_t aggregator_pid() const { return aggregator_ ? aggregator_->pid() : -1; }
  // What the running aggregator has printed so far.
  std::string aggregator_output() const { return aggregator_ ? aggregator_->output() : std::string(); }

  // Runs one worker per rank, using the backend of the kind started last, until
  // all exit, the deadline passes or `cancelled` is true. Gloo's ranks meet in a
  // fresh directory that is removed afterwards, and each binds its own address.
  std::vector<ProcessResult> run_workers(const JobSpec& job, Clock::time_point deadline,
                                         const std::function<bool()>& cancelled = {});

 private:
  std::filesystem::path binary_;
  const Testbed& testbed_;
  std::optional<Process> aggregator_;
  AggregatorKind kind_ = AggregatorKind::Xdp;
};

// The JSON objects a `xagg worker --json` printed, one per iteration, in order.
std::vector<nlohmann::json> worker_reports(const std::string& output);

}  // namespace xagg::testbed
