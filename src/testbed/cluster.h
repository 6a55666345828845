// Runs an XAgg job on a testbed: the aggregator daemon in <p>-agg and one
// verifying `xagg worker` per worker namespace. Shared by the demo and the
// end-to-end tests.
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

struct JobSpec {
  uint32_t workers = 2;
  uint64_t elements = 1024;
  uint32_t iterations = 1;
  std::string dtype = "float32";  // or int32
  std::string op = "sum";         // or average
  uint32_t job_id = 1;
  uint64_t seed = 1;
  std::map<uint32_t, uint32_t> start_delay_ms;  // rank -> delay before joining
};

class Cluster {
 public:
  // xagg_binary: the `xagg` executable that runs the aggregator and the workers.
  Cluster(std::filesystem::path xagg_binary, const Testbed& testbed);

  // Starts the aggregator on the testbed and returns once its control port accepts.
  void start_aggregator(Clock::time_point deadline);
  // Stops it with SIGTERM (SIGKILL after a grace period) and returns its result.
  ProcessResult stop_aggregator();
  bool aggregator_running();
  // The running aggregator's data-plane counters, as `xagg stats` prints them.
  std::string aggregator_stats();

  // Runs one worker per rank until all exit, the deadline passes or `cancelled` is true.
  std::vector<ProcessResult> run_workers(const JobSpec& job, Clock::time_point deadline,
                                         const std::function<bool()>& cancelled = {});

 private:
  std::filesystem::path binary_;
  const Testbed& testbed_;
  std::optional<Process> aggregator_;
};

// The JSON objects a `xagg worker --json` printed, one per iteration, in order.
std::vector<nlohmann::json> worker_reports(const std::string& output);

}  // namespace xagg::testbed
