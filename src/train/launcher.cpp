#include "launcher.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "backend.h"
#include "cluster.h"
#include "output_file.h"
#include "fashion_mnist.h"
#include "process.h"
#include "testbed.h"

namespace xagg::train {
namespace {

using xagg::Clock;
using xagg::Process;
using xagg::ProcessSpec;


// Backends trained by PyTorch's DistributedDataParallel in ddp_worker.py rather than by
// xagg-train's own bucketing (ddp_worker.py sets each one up), with the servers their ranks reach.
struct DdpBackend {
  std::string name;
  testbed::AggregatorKind servers;
};
const std::vector<DdpBackend> kDdpBackends = {
    {"ddp-xagg", testbed::AggregatorKind::Xdp},       // the "xagg" process group
    {"ddp-hook", testbed::AggregatorKind::Xdp},       // Gloo, buckets through xagg_torch.allreduce_hook
    {"ddp-hook16", testbed::AggregatorKind::Xdp},     // Gloo, buckets through xagg_torch.wire16_hook
    {"ddp-gloo", testbed::AggregatorKind::Gloo},      // Gloo alone
    {"ddp-gloo-fp16", testbed::AggregatorKind::Gloo}  // Gloo with torch's fp16_compress_hook
};
const DdpBackend* find_ddp(const std::string& backend) {
  auto found = std::ranges::find(kDdpBackends, backend, &DdpBackend::name);
  return found == kDdpBackends.end() ? nullptr : &*found;
}
bool is_ddp(const std::string& backend) { return find_ddp(backend) != nullptr; }
// The servers a backend's ranks reach: XAgg's aggregators or a baseline's (none for Gloo).
testbed::AggregatorKind server_kind(const std::string& backend) {
  using testbed::AggregatorKind;
  if (const DdpBackend* ddp = find_ddp(backend)) return ddp->servers;
  if (backend == "xagg") return AggregatorKind::Xdp;
  if (backend == "tcp-ps") return AggregatorKind::TcpPs;
  if (backend == "switch") return AggregatorKind::Switch;
  if (backend == "switch-jumbo") return AggregatorKind::SwitchJumbo;
  return AggregatorKind::Gloo;
}
// Where --wire-bits 16 applies: the backends whose float32 all-reduces go through an XAgg job
// at its width (ddp-hook16 is ddp-hook on the 16-bit wire already).
bool takes_wire_bits(const std::string& backend) { return backend == "xagg" || backend == "ddp-xagg"; }

// The command line of one rank: xagg-train's own worker, or the DDP worker
// under Debian's python3 (whose ABI xagg_torch is built for).
std::vector<std::string> worker_argv(const TrainConfig& train, uint32_t rank, const std::optional<std::string>& netns,
                                     const std::string& local_address) {
  const std::string config = nlohmann::json(train).dump();
  if (!is_ddp(train.backend)) {
    std::vector<std::string> argv = {std::filesystem::read_symlink("/proc/self/exe"), "worker", "--config", config,
                                     "--rank", std::to_string(rank)};
    if (netns) argv.insert(argv.end(), {"--local-address", local_address});
    return argv;
  }
  return {"ip", "netns", "exec", *netns, "env", "PYTHONPATH=" XAGG_TORCH_DIR, "/usr/bin/python3", XAGG_DDP_WORKER,
          "--config", config, "--rank", std::to_string(rank)};
}

// Reads the JSON lines a worker appends to its output file, as they arrive.
class EventReader {
 public:
  explicit EventReader(std::filesystem::path file) : file_(std::move(file)) {}
  std::vector<nlohmann::json> read_new() {
    std::vector<nlohmann::json> events;
    std::ifstream input(file_);
    input.seekg(offset_);
    for (std::string line; std::getline(input, line) && !input.eof(); offset_ += line.size() + 1) {
      if (line.empty() || line.front() != '{') continue;  // log lines share the stream
      auto event = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (event.is_object()) events.push_back(std::move(event));
    }
    return events;
  }

 private:
  std::filesystem::path file_;
  std::streamoff offset_ = 0;
};

// One line on stderr, redrawn in place on a terminal; elsewhere only the epoch summaries appear.
class ProgressLine {
 public:
  ProgressLine() : interactive_(isatty(STDERR_FILENO)) {}
  void show(const nlohmann::json& progress, uint32_t epochs) {
    if (!interactive_) return;
    constexpr int kWidth = 30;
    double done = progress["step"].get<double>() / progress["steps"].get<double>();
    int filled = static_cast<int>(done * kWidth);
    std::cerr << fmt::format("\repoch {}/{} [{}{}] {:3.0f}% loss {:.4f} {:.1f} ms/it comm {:.0f}%  ",
                             progress["epoch"].get<int>(), epochs, std::string(filled, '#'),
                             std::string(kWidth - filled, '.'), 100 * done, progress["loss"].get<double>(),
                             progress["iteration_ms"].get<double>(), 100 * progress["comm_share"].get<double>())
              << std::flush;
  }
  void finish_line(const std::string& text) { std::cerr << (interactive_? "\r\033[K" : "") << text << std::endl; }

 private:
  bool interactive_;
};

std::string summary_line(const nlohmann::json& epoch) {
  return fmt::format("epoch {}: loss {:.4f}, test accuracy {:.2f}%, {:.2f} ms/iteration, {:.0f}% communicating "
                     "({:.0f}% not overlapped), {:.1f} s",
                     epoch["epoch"].get<int>(), epoch["train_loss"].get<double>(), epoch["test_accuracy"].get<double>(),
                     epoch["iteration_ms"].get<double>(), 100 * epoch["comm_share"].get<double>(),
                     100 * epoch["exposed_comm_share"].get<double>(), epoch["wall_s"].get<double>());
}

// The scenario's compute times as slowdown factors relative to the fastest worker;
// none when the scenario gives no compute times (all 0).
std::vector<double> compute_skew(const testbed::Scenario& scenario) {
  const double fastest = *std::min_element(scenario.compute_ms.begin(), scenario.compute_ms.end());
  if (fastest <= 0) return {};
  std::vector<double> factors;
  for (double ms : scenario.compute_ms) factors.push_back(ms / fastest);
  return factors;
}

// The root qdisc of one interface as the kernel reports it (tc's JSON).
nlohmann::json root_qdisc(const std::string& netns, const std::string& interface) {
  auto qdiscs = nlohmann::json::parse(
      xagg::run_command({"ip", "netns", "exec", netns, "tc", "-s", "-j", "qdisc", "show", "dev", interface, "root"}));
  const nlohmann::json& qdisc = qdiscs.at(0);
  // tc reports the rate in bytes/s; a qdisc without one (noqueue) is unshaped: 0.
  const double rate = qdisc.value("options", nlohmann::json::object()).value("rate", 0.0);
  return {{"kind", qdisc.at("kind")},
          {"rate_gbit", rate * 8 / 1e9},
          {"bytes", qdisc.at("bytes")},
          {"drops", qdisc.at("drops")}};
}

// What the kernel has on both ends of every worker's link at the end of the training: proof
// in the log that the scenario's shaping was in place and carried the traffic.
nlohmann::json worker_links(const testbed::Testbed& testbed, uint32_t workers) {
  nlohmann::json links = nlohmann::json::array();
  for (uint32_t rank = 0; rank < workers; ++rank) {
    testbed::HostLink host = testbed.worker(rank);
    links.push_back({{"rank", rank},
                     {"egress", root_qdisc(host.netns, testbed::kHostInterface)},
                     {"ingress", root_qdisc(testbed.switch_netns(), host.bridge_port)}});
  }
  return links;
}

std::string tail(const std::string& text, size_t bytes = 4000) {
  return text.size() <= bytes ? text : text.substr(text.size() - bytes);
}

// The options' checks before anything is built: otherwise a bad value shows up only in the workers
// (a division by zero, NaN metrics) or after the testbed is up.
void validate(const LaunchConfig& config) {
  const TrainConfig& train = config.train;
  const auto names = backends::backend_names();
  if (train.backend != "none" && std::ranges::find(names, train.backend) == names.end() && !is_ddp(train.backend))
    throw std::invalid_argument(fmt::format("--backend {}: use {}", train.backend, backend_choices()));
  if (train.wire_bits != 32 && !takes_wire_bits(train.backend))
    throw std::invalid_argument(fmt::format("--wire-bits {} is for the xagg and ddp-xagg backends (ddp-hook16 "
                                            "is ddp-hook on the 16-bit wire)", train.wire_bits));
  if (is_ddp(train.backend) && !std::filesystem::exists(XAGG_TORCH_DIR "/xagg_torch/__init__.py"))
    throw std::invalid_argument(fmt::format("--backend {} needs the xagg_torch extension: build the xagg_torch target",
                                            train.backend));
  if (config.workers == 0) throw std::invalid_argument("--workers must be at least 1");
  if (train.batch_size < config.workers || train.batch_size % config.workers != 0)
    throw std::invalid_argument(fmt::format("--batch-size {}: must be a positive multiple of the {} workers",
                                            train.batch_size, config.workers));
  const uint32_t samples = train.train_samples == 0 ? kTrainImages : std::min(train.train_samples, kTrainImages);
  if (train.batch_size > samples)
    throw std::invalid_argument(fmt::format("--batch-size {}: larger than the {} training samples used",
                                            train.batch_size, samples));
  if (!train.compute_skew.empty() && train.compute_skew.size() != config.workers)
    throw std::invalid_argument(fmt::format("--compute-skew needs one factor per worker ({}), got {}",
                                            config.workers, train.compute_skew.size()));
  if (std::ranges::any_of(train.compute_skew, [](double factor) { return !(factor >= 1); }))
    throw std::invalid_argument("--compute-skew factors must be at least 1");
  if (!config.plot.empty() && config.log.empty()) throw std::invalid_argument("--plot needs --log");
}


}  // namespace

std::string backend_choices() {
  std::vector<std::string> ddp_names;
  for (const DdpBackend& ddp : kDdpBackends) ddp_names.push_back(ddp.name);
  return fmt::format("none (single process), {}; or PyTorch DDP: {}", fmt::join(backends::backend_names(), ", "),
                     fmt::join(ddp_names, ", "));
}

nlohmann::json launch_training(const LaunchConfig& config) {
  validate(config);
  const xagg::InterruptGuard interrupts;  // Ctrl-C stops the ranks and removes the testbed
  const bool single_process = config.train.backend == "none";
  if (config.scenario && (single_process || config.scenario->workers != config.workers))
    throw std::invalid_argument(fmt::format("scenario {} needs a backend and {} workers", config.scenario->name,
                                            config.scenario->workers));
  if (single_process && config.workers != 1) throw std::invalid_argument("backend 'none' trains in a single process: use --workers 1");
  if (!single_process && geteuid() != 0)
    throw std::runtime_error("training through a backend needs root (it creates network namespaces)");
  TrainConfig train = config.train;
  train.world_size = config.workers;
  if (config.scenario && train.compute_skew.empty()) train.compute_skew = compute_skew(*config.scenario);
  std::ofstream log_file;
  if (!config.log.empty()) log_file = open_output(config.log);
  // The workers' outputs and gloo's file store.
  xagg::TempDirectory run_directory("xtrain-run");
  train.rendezvous = run_directory.path().string();
  const auto deadline = Clock::now() + config.timeout;

  testbed::Testbed testbed(config.prefix);
  std::optional<testbed::TeardownGuard> teardown;
  std::optional<testbed::ScenarioNetwork> network;
  std::optional<testbed::Cluster> cluster;
  if (!single_process) {
    teardown.emplace(testbed);  // first: a partial up() is torn down too
    if (config.scenario)
      testbed.up(config.workers, config.scenario->layout, config.scenario->mtu);
    else
      testbed.up(config.workers);
    if (const auto& scenario = config.scenario) {
      network.emplace(testbed, *scenario);
      std::cerr << fmt::format("scenario {}: aggregators {}, worker Gbit/s [{}], aggregator {} Gbit/s, loss {}, "
                               "compute skew [{}]\n",
                               scenario->name, scenario->layout.to_string(), fmt::join(scenario->worker_gbit, ", "),
                               fmt::join(scenario->aggregator_gbit, ", "),
                               scenario->loss, fmt::join(train.compute_skew, ", "));
    }
    // As the benchmarks do: a server on every aggregator host of the layout (the
    // TCP PS sharded over them, XAgg's job spread over them or in two levels).
    cluster.emplace(config.xagg_binary, testbed);
    cluster->start_aggregator(deadline, server_kind(train.backend));
    const testbed::Cluster::JobServers servers = cluster->job_servers(config.workers);
    train.servers = servers.servers;
    train.root_server = servers.root;
    train.ranks_per_leaf = servers.ranks_per_leaf;
    train.port = servers.port;
  }

  std::vector<Process> workers;
  for (uint32_t rank = 0; rank < config.workers; ++rank) {
    std::optional<std::string> netns;
    std::string local_address;
    if (!single_process) {
      netns = testbed.worker(rank).netns;
      local_address = testbed.worker(rank).address;
    }
    workers.emplace_back(ProcessSpec{.argv = worker_argv(train, rank, netns, local_address),
                                     .netns = is_ddp(train.backend) ? std::nullopt : netns,
                                     .output_file = run_directory.path() / fmt::format("rank{}.log", rank)});
  }

  nlohmann::json log = {{"config", train},
                        {"workers", config.workers},
                        {"evaluations", nlohmann::json::array()},
                        {"epochs", nlohmann::json::array()}};
  EventReader rank0(run_directory.path() / "rank0.log");
  ProgressLine progress;
  auto handle_events = [&] {
    for (auto& event : rank0.read_new()) {
      if (event["event"] == "progress") progress.show(event, train.epochs);
      if (event["event"] == "start") log["start"] = event;
      if (event["event"] == "evaluation") log["evaluations"].push_back(event);
      if (event["event"] == "epoch") {
        progress.finish_line(summary_line(event));
        log["epochs"].push_back(event);
      }
      if (event["event"] == "done") log["wall_s"] = event["wall_s"];
    }
  };
  for (size_t running = workers.size(); running > 0;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    xagg::throw_if_interrupted();
    handle_events();
    running = 0;
    for (uint32_t rank = 0; rank < workers.size(); ++rank) {
      std::optional<int> exit_code = workers[rank].poll();
      if (!exit_code) ++running;
      else if (*exit_code != 0)
        throw std::runtime_error(fmt::format("worker {} exited with {}:\n{}", rank, *exit_code,
                                             tail(workers[rank].output())));
    }
    if (running > 0 && Clock::now() > deadline)
      throw std::runtime_error(fmt::format("training did not finish within {} s", config.timeout.count()));
  }
  handle_events();
  if (const auto& scenario = config.scenario) {
    log["scenario"] = {{"name", scenario->name},
                       {"worker_gbit", scenario->worker_gbit},
                       {"aggregator_gbit", scenario->aggregator_gbit},
                       {"loss", scenario->loss},
                       {"compute_ms", scenario->compute_ms},
                       {"links", worker_links(testbed, config.workers)}};
    if (const auto* impairment = network->impairment()) log["scenario"]["loss_injected"] = impairment->report();
  }

  if (log_file.is_open()) {
    log_file << log.dump(2) << std::endl;
    close_output(log_file, config.log);  // complete before the plot reads it
  }
  if (!config.plot.empty()) plot_logs({config.log}, config.plot);
  return log;
}

void plot_logs(const std::vector<std::filesystem::path>& logs, const std::filesystem::path& png) {
  std::vector<std::string> argv = {"/usr/bin/python3", XAGG_PLOT_SCRIPT, "--output", png.string()};
  for (const auto& log : logs) argv.push_back(log.string());
  xagg::run_command(argv, std::chrono::seconds(120));
}

}  // namespace xagg::train
