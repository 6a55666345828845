// The coordinator of `xagg-train`: sets up the testbed and the backend's
// server, runs one `xagg-train worker` per rank in the worker namespaces,
// shows rank 0's progress, and writes the JSON log and the plot.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>

#include "scenario.h"
#include "testbed.h"
#include "train_config.h"

namespace xagg::train {

struct LaunchConfig {
  TrainConfig train;
  uint32_t workers = 1;
  std::string prefix = testbed::per_run_prefix("xtrain");         // testbed namespaces <prefix>-sw, -agg, -wI
  std::filesystem::path xagg_binary;     // runs the aggregator and the parameter server
  std::filesystem::path log;             // JSON log (empty: none)
  std::filesystem::path plot;            // PNG of test accuracy vs wall-clock (empty: none)
  std::chrono::seconds timeout{3600};
  // A heterogeneous scenario (scenarios/*.json): its links are shaped (and made lossy) as
  // `xagg bench hetero` does, and unless train.compute_skew is set its compute_ms become the
  // skew factors, relative to the fastest worker. Needs workers == scenario->workers.
  std::optional<testbed::Scenario> scenario;
};

// The --backend names, for the help and the error on a wrong one.
std::string backend_choices();

// Runs the training and returns the log: the configuration, rank 0's "start"
// event, one entry per epoch and, with a scenario, what the kernel reports of its
// links. Throws when a worker fails, naming it with its output.
nlohmann::json launch_training(const LaunchConfig& config);

// Writes a PNG of test accuracy vs wall-clock for these logs with python/plot_training.py.
void plot_logs(const std::vector<std::filesystem::path>& logs, const std::filesystem::path& png);

}  // namespace xagg::train
