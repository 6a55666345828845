// xagg-train: data-parallel training on Fashion-MNIST through XAgg or a
// baseline (docs/training.md). `xagg train ARGS` runs `xagg-train ARGS`.
//
//   xagg-train --workers 4 --backend xagg --epochs 3 --log xagg.json --plot xagg.png
//   xagg-train --backend xagg --scenario scenarios/both.json --log both.json
//   xagg-train worker --config JSON --rank R [--local-address A] [--netns NS]   (started by the above)
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <iostream>

#include "launcher.h"
#include "netns.h"
#include "trainer.h"

namespace {

using xagg::train::LaunchConfig;
using xagg::train::TrainConfig;

void add_training_options(CLI::App& app, LaunchConfig& config, std::string& scenario_file) {
  TrainConfig& train = config.train;
  app.add_option("--workers", config.workers, "Worker processes (one per testbed namespace)")->capture_default_str();
  app.add_option("--backend", train.backend, xagg::train::backend_choices())->capture_default_str();
  app.add_option("--wire-bits", train.wire_bits,
                 "xagg, ddp-xagg: the XAgg job's wire, 32 or 16 (the gradient as 2 bytes per element each way)")
      ->check(CLI::IsMember({16, 32}))
      ->capture_default_str();
  app.add_option("--model", train.model,
                 "cnn (225 k parameters, compute-bound) or mlp (784-hidden-hidden-10, communication-bound)")
      ->check(CLI::IsMember({"cnn", "mlp"}))
      ->capture_default_str();
  app.add_option("--hidden", train.hidden, "mlp: width of its two hidden layers")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--epochs", train.epochs)->capture_default_str();
  app.add_option("--batch-size", train.batch_size, "Global batch, split evenly over the workers")->capture_default_str();
  app.add_option("--lr", train.learning_rate, "SGD learning rate")->capture_default_str();
  app.add_option("--momentum", train.momentum)->capture_default_str();
  app.add_option("--seed", train.seed)->capture_default_str();
  app.add_option("--train-samples", train.train_samples, "Train on the first N images (0: all)")->capture_default_str();
  app.add_option("--test-samples", train.test_samples, "Test on the first N images (0: all)")->capture_default_str();
  app.add_option("--bucket-elements", train.bucket_elements, "Gradient elements per all-reduce bucket")
      ->capture_default_str();
  app.add_option("--eval-every", train.eval_every,
                 "Also evaluate the test set every N steps within an epoch (0: only at its end)")
      ->capture_default_str();
  app.add_option("--threads", train.threads, "Torch threads per worker")->capture_default_str();
  app.add_option("--compute-skew", train.compute_skew,
                 "Per-rank slowdown factors, e.g. 1,1,1,3: rank 3 computes 3x slower (sleeps)")
      ->delimiter(',');
  app.add_option("--scenario", scenario_file,
                 "Heterogeneous scenario (scenarios/*.json): link rates, loss, and compute_ms as the skew unless "
                 "--compute-skew is given; sets --workers")
      ->check(CLI::ExistingFile);
  app.add_option("--data-dir", train.data_dir, "Fashion-MNIST .gz files")->capture_default_str();
  app.add_option("--cache-dir", train.cache_dir, "Where they are decompressed")->capture_default_str();
  app.add_option("--job", train.job_id, "XAgg job id")->capture_default_str();
  app.add_option("--prefix", config.prefix, "Testbed namespace prefix")->capture_default_str();
  app.add_option("--xagg-binary", config.xagg_binary, "The xagg executable (default: next to this one)");
  app.add_option("--log", config.log, "Write the JSON log here");
  app.add_option("--plot", config.plot, "Write a PNG of test accuracy vs wall-clock here (needs --log)");
  app.add_option("--timeout", config.timeout, "Seconds before giving up")->capture_default_str();
}

void run_worker(const std::string& config_json, uint32_t rank, const std::string& local_address,
                const std::string& netns) {
  if (!netns.empty()) xagg::enter_netns(netns);  // first: sockets and threads live in the namespace
  TrainConfig config = nlohmann::json::parse(config_json);
  xagg::train::BackendFactory connect;
  if (config.backend != "none") {
    connect = [&](uint64_t max_elements) {
      xagg::backends::BackendConfig backend_config{.name = config.backend,
                                                 .servers = config.servers,
                                                 .port = config.port,
                                                 .job_id = config.job_id,
                                                 .rank = rank,
                                                 .world_size = config.world_size,
                                                 .max_elements = max_elements,
                                                 .rendezvous = config.rendezvous,
                                                 .local_address = local_address,
                                                 .root_server = config.root_server,
                                                 .ranks_per_leaf = config.ranks_per_leaf,
                                                 .wire_bits = config.wire_bits};
      return xagg::backends::make_backend(backend_config);
    };
  }
  xagg::train::train_rank(config, rank, connect, std::cout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Data-parallel training of a CNN on Fashion-MNIST through XAgg or a baseline"};
  LaunchConfig config;
  std::string scenario_file;
  add_training_options(app, config, scenario_file);

  auto* worker = app.add_subcommand("worker", "One rank (started by xagg-train itself)")->group("");
  std::string config_json, local_address, netns;
  uint32_t rank = 0;
  worker->add_option("--config", config_json)->required();
  worker->add_option("--rank", rank)->required();
  worker->add_option("--local-address", local_address);
  worker->add_option("--netns", netns);
  CLI11_PARSE(app, argc, argv);

  try {
    if (*worker) {
      run_worker(config_json, rank, local_address, netns);
      return 0;
    }
    if (config.xagg_binary.empty())
      config.xagg_binary = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "xagg";
    if (!scenario_file.empty()) {
      config.scenario = xagg::testbed::load_scenario(scenario_file);
      if (app.count("--workers") == 0) config.workers = config.scenario->workers;
    }
    xagg::train::launch_training(config);
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
    return 1;
  }
  return 0;
}
