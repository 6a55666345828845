// `xagg bench hetero`: data-parallel iterations on a heterogeneous testbed
// (per-link bandwidth, per-worker compute time, loss) for XAgg and the
// baselines side by side. Each rank is a `xagg bench hetero-worker` process
// that emulates compute with sleeps and streams the model's gradients in
// backward order, bucket by bucket (as DDP does), through one Backend.
//
// Times are CLOCK_MONOTONIC microseconds, comparable across the namespaces.
//   communication (per worker):  whole gradient ready -> last result received
//   critical path (per iteration): last worker ready -> last result received
//   iteration (per iteration):     between the last results of consecutive iterations
//   link bound (per iteration):    the least critical path the links allow a system that
//                                  aggregates as this one does (link_bound.h)
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "backend.h"
#include "bench.h"
#include "cluster.h"
#include "gradient.h"
#include "link_bound.h"
#include "netns.h"
#include "output_file.h"
#include "planner.h"
#include "scenario.h"
#include "shaping.h"

namespace xagg::bench {
namespace {

using plan::LinkDemand;
using plan::balanced_weights;
using plan::link_demands;
using plan::aggregation_of;
using plan::link_bound_ms;
using plan::backward_buckets;
using plan::trace_file;

using xagg::Clock;
using testbed::Scenario;
using testbed::load_scenario;
using nlohmann::json;
namespace fs = std::filesystem;

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
}

// ---- one rank ----

struct WorkerOptions {
  std::string scenario;
  std::string system;  // one of kSystems
  uint32_t rank = 0;
  uint32_t iterations = 5;
  std::vector<std::string> servers{testbed::kAggregatorAddress};  // the job's aggregators, in order
  std::vector<uint32_t> server_weights;                           // their shares; empty: equal
  std::string root_server;       // xagg, two levels: the root; `servers` are the leaves
  uint32_t ranks_per_leaf = 0;
  uint16_t port = 0;
  std::string rendezvous;
  std::string local_address;
  std::string netns;
  uint64_t seed = 1;
};

// Buckets handed from the emulated backward pass to the communication thread.
class ReadyBuckets {
 public:
  void push(size_t bucket) {
    std::lock_guard lock(mutex_);
    ready_.push_back(bucket);
    changed_.notify_one();
  }
  size_t pop() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !ready_.empty(); });
    size_t bucket = ready_.front();
    ready_.pop_front();
    return bucket;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<size_t> ready_;
};

// xagg16: XAgg on the 16-bit wire (docs/protocol.md section 11); gloo16: Gloo's float16 all-reduce.
constexpr BenchSystem kSystems[] = {
    {"xagg", testbed::AggregatorKind::Xdp},       {"xagg16", testbed::AggregatorKind::Xdp, 16},
    {"switch", testbed::AggregatorKind::Switch},  {"switch-jumbo", testbed::AggregatorKind::SwitchJumbo},
    {"tcp-ps", testbed::AggregatorKind::TcpPs},   {"gloo", testbed::AggregatorKind::Gloo},
    {"gloo16", testbed::AggregatorKind::Gloo, 16}};

const BenchSystem& hetero_system(const std::string& name) { return system_named(kSystems, name); }

void run_worker(const WorkerOptions& options) {
  Scenario scenario = load_scenario(options.scenario);
  std::vector<uint64_t> buckets =
      backward_buckets(trace_file(options.scenario, scenario.model), scenario.gradient_scale, scenario.bucket_mb);
  uint64_t total = 0;
  for (uint64_t b : buckets) total += b;

  backends::BackendConfig config;
  const BenchSystem& system = hetero_system(options.system);
  config.name = testbed::backend_of(system.kind);
  config.wire_bits = system.wire_bits;
  config.servers = options.servers;
  config.server_weights = options.server_weights;
  config.root_server = options.root_server;
  config.ranks_per_leaf = options.ranks_per_leaf;
  config.port = options.port;
  config.rank = options.rank;
  config.world_size = scenario.workers;
  config.max_elements = total;  // room for every bucket of a step at once
  config.rendezvous = options.rendezvous;
  config.local_address = options.local_address;
  config.operation_timeout = std::chrono::milliseconds(120000);
  auto backend = backends::make_backend(config);

  std::vector<float> base(total), gradient(total);
  std::mt19937_64 random(options.seed * 1000003 + options.rank);
  std::uniform_real_distribution<double> jitter(1 - scenario.compute_jitter, 1 + scenario.compute_jitter);
  std::uniform_real_distribution<float> values(-1, 1);
  for (float& value : base) value = values(random);
  // Gradients change from step to step as in training: each bucket's
  // magnitude walks in log2 steps of N(0, 0.5), the same walk on every rank
  // (they train one model), so that a bucket now and then leaves the margin
  // of XAgg's predicted exponents and its redo is paid as in training.
  std::mt19937_64 shared_random(options.seed);
  std::normal_distribution<double> magnitude_step(0, 0.5);
  std::vector<double> log2_magnitude(buckets.size(), 0);

  for (uint32_t iteration = 0; iteration < options.iterations; ++iteration) {
    const int64_t start = now_us();
    const double compute_us = scenario.compute_ms[options.rank] * 1000 * jitter(random);
    ReadyBuckets ready;
    int64_t done = 0;
    // Each bucket is handed over as soon as it is ready, as DDP does; the
    // system decides whether it runs several at once.
    std::thread communication([&] {
      uint64_t offset = 0;
      std::vector<std::shared_ptr<Work>> works;
      backend->begin_step();
      for (size_t b = 0; b < buckets.size(); ++b) {
        ready.pop();
        works.push_back(backend->allreduce_async(gradient.data() + offset, buckets[b], ReduceOp::Average));
        offset += buckets[b];
      }
      for (auto& work : works) work->wait();
      done = now_us();
    });
    // Forward takes a third of the compute, backward the rest, spread over
    // the buckets by size; a bucket is ready when backward has passed it.
    double elapsed_us = compute_us / 3;
    int64_t first_ready = 0;
    for (size_t b = 0, offset = 0; b < buckets.size(); offset += buckets[b++]) {
      log2_magnitude[b] = std::clamp(log2_magnitude[b] + magnitude_step(shared_random), -4.0, 4.0);
      const float scale = static_cast<float>(std::exp2(log2_magnitude[b]));
      for (size_t i = offset; i < offset + buckets[b]; ++i) gradient[i] = base[i] * scale;  // backward writes it
      elapsed_us += compute_us * 2 / 3 * double(buckets[b]) / double(total);
      std::this_thread::sleep_until(Clock::time_point(std::chrono::microseconds(start + int64_t(elapsed_us))));
      if (b == 0) first_ready = now_us();
      ready.push(b);
    }
    const int64_t gradient_ready = now_us();
    communication.join();
    fmt::print("{}\n", json{{"iteration", iteration}, {"start_us", start}, {"first_ready_us", first_ready},
                            {"ready_us", gradient_ready}, {"done_us", done}}.dump());
    std::fflush(stdout);
  }
}

// ---- the driver ----

struct BenchOptions {
  std::string scenario;
  uint32_t iterations = 10;  // timed, after one warm-up iteration
  uint32_t rounds = 1;       // every system runs once per round, in turn
  std::string json_file;
  std::string csv_file;
  std::string plots_dir;
  std::string prefix = testbed::per_run_prefix("xhet");
  std::vector<std::string> systems;  // overrides the scenario's list
  std::string aggregators;           // overrides the scenario's layout
  std::optional<double> loss;        // overrides the scenario's loss rate
  std::optional<uint32_t> wire_bits;  // overrides the scenario's wire_bits
  uint32_t timeout_s = 600;
};

struct WorkerIteration {
  int64_t start_us = 0, first_ready_us = 0, ready_us = 0, done_us = 0;  // first_ready: the first bucket's
};

// One system's figures, over all its rounds.
struct SystemRun {
  std::string system;
  std::vector<std::vector<WorkerIteration>> iterations;  // [iteration][worker], timed ones only
  std::vector<uint32_t> round;                           // per iteration, from 1
  std::vector<double> communication_ms;                  // every (iteration, worker)
  std::vector<double> critical_ms;                       // per iteration
  std::vector<double> iteration_ms;                      // per iteration
  std::vector<double> link_bound_ms;                     // per iteration
  std::vector<double> round_critical_ms;                 // each round's median critical path
  std::vector<uint64_t> flow_bytes;                      // per competing flow, during the timed iterations
  double flow_seconds = 0;                               // their span, over all rounds

  // What each flow moved from the first timed iteration's start to the last one's end of a round.
  void add_flows(const std::vector<std::unique_ptr<testbed::CompetingFlow>>& flows, const SystemRun& round) {
    int64_t first_start = INT64_MAX, last_done = 0;
    for (const WorkerIteration& w : round.iterations.front()) first_start = std::min(first_start, w.start_us);
    for (const WorkerIteration& w : round.iterations.back()) last_done = std::max(last_done, w.done_us);
    const Clock::time_point from{std::chrono::microseconds(first_start)}, to{std::chrono::microseconds(last_done)};
    flow_bytes.resize(flows.size());
    for (size_t i = 0; i < flows.size(); ++i) flow_bytes[i] += flows[i]->bytes_at(to) - flows[i]->bytes_at(from);
    flow_seconds += std::chrono::duration<double>(to - from).count();
  }
  std::vector<double> flow_gbit() const {
    std::vector<double> gbit;
    for (uint64_t bytes : flow_bytes) gbit.push_back(flow_seconds > 0 ? double(bytes) * 8 / flow_seconds / 1e9 : 0);
    return gbit;
  }
};

// Nearest rank: the smallest value with at least `fraction` of all at or below it.
double percentile(std::vector<double> values, double fraction) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<size_t>(std::ceil(fraction * double(values.size())));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

// Adds a further round of the same system.
void append_round(SystemRun& run, const SystemRun& round) {
  const auto number = static_cast<uint32_t>(run.round_critical_ms.size());
  run.system = round.system;
  run.iterations.insert(run.iterations.end(), round.iterations.begin(), round.iterations.end());
  run.round.insert(run.round.end(), round.iterations.size(), number + 1);
  for (auto field : {&SystemRun::communication_ms, &SystemRun::critical_ms, &SystemRun::iteration_ms,
                     &SystemRun::link_bound_ms})
    (run.*field).insert((run.*field).end(), (round.*field).begin(), (round.*field).end());
  run.round_critical_ms.push_back(percentile(round.critical_ms, 0.5));
}

// The least critical path the links allow in an iteration with these ready
// times (link_bound.h), for a system that aggregates as `system` does.
double iteration_link_bound_ms(const std::vector<WorkerIteration>& workers, const std::vector<LinkDemand>& links) {
  int64_t any_first_ready = INT64_MAX, every_first_ready = 0, last_ready = 0;
  for (const WorkerIteration& w : workers) {
    any_first_ready = std::min(any_first_ready, w.first_ready_us);
    every_first_ready = std::max(every_first_ready, w.first_ready_us);
    last_ready = std::max(last_ready, w.ready_us);
  }
  return link_bound_ms(links, double(any_first_ready), double(every_first_ready), double(last_ready));
}

// The weights XAgg and the TCP PS shard the job with: balanced for the
// scenario's link rates (link_bound.h), as a deployment would set them.
std::vector<uint32_t> scenario_weights(const Scenario& scenario) {
  return balanced_weights(scenario.layout, scenario.workers, scenario.worker_gbit, scenario.aggregator_gbit);
}

// The links a system uses: the switch baseline models one switch, on the
// first aggregator host; Gloo's ring runs among the workers.
std::vector<LinkDemand> system_links(const Scenario& scenario, const std::string& system, uint64_t elements) {
  return link_demands(scenario.layout, scenario.workers, scenario.worker_gbit, scenario.aggregator_gbit,
                      aggregation_of(hetero_system(system).kind, scenario.layout),
                      double(elements) * hetero_system(system).wire_bits / 8, scenario_weights(scenario));
}

// The aggregator addresses a system's workers are given, and their weights.
std::vector<std::string> server_options(const testbed::Testbed& bed, const Scenario& scenario,
                                        const std::string& system) {
  std::vector<std::string> addresses = bed.aggregator_addresses();
  if (system == "switch" || system == "switch-jumbo") return {"--server", addresses.front()};
  if (const uint32_t per_leaf = scenario.layout.ranks_per_leaf(scenario.workers);
      per_leaf && hetero_system(system).kind == testbed::AggregatorKind::Xdp) {
    const std::string root = addresses.back();
    addresses.pop_back();
    return {"--server", fmt::format("{}", fmt::join(addresses, ",")), "--root-server", root, "--ranks-per-leaf",
            std::to_string(per_leaf)};
  }
  std::vector<std::string> options{"--server", fmt::format("{}", fmt::join(addresses, ","))};
  if (std::vector<uint32_t> weights = scenario_weights(scenario); !weights.empty())
    options.insert(options.end(), {"--server-weights", fmt::format("{}", fmt::join(weights, ","))});
  return options;
}

// Starts the system's server (none for gloo) for the lifetime of the object.
class SystemServer {
 public:
  SystemServer(const std::string& system, testbed::Cluster& cluster) : cluster_(cluster) {
    cluster.start_aggregator(Clock::now() + std::chrono::seconds(30), hetero_system(system).kind);
  }
  ~SystemServer() { cluster_.stop_aggregator(); }
  SystemServer(const SystemServer&) = delete;
  SystemServer& operator=(const SystemServer&) = delete;

 private:
  testbed::Cluster& cluster_;
};

SystemRun run_system(const BenchOptions& options, const Scenario& scenario, uint64_t elements,
                     const std::string& system, testbed::Cluster& cluster, const testbed::Testbed& bed) {
  const fs::path binary = fs::read_symlink("/proc/self/exe");
  SystemServer server(system, cluster);
  xagg::TempDirectory rendezvous(options.prefix + "-gloo");  // gloo's file store

  std::vector<xagg::Process> workers;
  for (uint32_t rank = 0; rank < scenario.workers; ++rank) {
    testbed::HostLink host = bed.worker(rank);
    std::vector<std::string> argv{binary.string(), "bench", "hetero-worker", "--scenario",
                                  fs::absolute(options.scenario).string(), "--system", system, "--rank",
                                  std::to_string(rank), "--iterations", std::to_string(options.iterations + 1),
                                  "--rendezvous", rendezvous.path().string(), "--local-address", host.address};
    std::ranges::copy(server_options(bed, scenario, system), std::back_inserter(argv));
    workers.emplace_back(xagg::ProcessSpec{argv, host.netns, {}});
  }
  auto results = xagg::wait_all(workers, Clock::now() + std::chrono::seconds(options.timeout_s));

  const std::vector<LinkDemand> links = system_links(scenario, system, elements);
  SystemRun run;
  run.system = system;
  run.iterations.assign(options.iterations + 1, std::vector<WorkerIteration>(scenario.workers));
  std::string failures;
  for (uint32_t rank = 0; rank < scenario.workers; ++rank)
    if (results[rank].exit_code != 0 || results[rank].timed_out)
      failures += fmt::format("\nworker {}{}:\n{}", rank, results[rank].timed_out ? " (timed out)" : "",
                              results[rank].output);
  if (!failures.empty()) throw std::runtime_error(fmt::format("{}: workers failed{}", system, failures));
  for (uint32_t rank = 0; rank < scenario.workers; ++rank) {
    for (const json& report : testbed::worker_reports(results[rank].output)) {
      auto& entry = run.iterations.at(report.at("iteration").get<uint32_t>()).at(rank);
      entry = {report.at("start_us").get<int64_t>(), report.at("first_ready_us").get<int64_t>(),
               report.at("ready_us").get<int64_t>(), report.at("done_us").get<int64_t>()};
    }
  }
  // Iteration 0 is the warm-up; it only provides the previous iteration's end.
  int64_t previous_done = 0;
  for (uint32_t i = 0; i < run.iterations.size(); ++i) {
    int64_t last_ready = 0, last_done = 0;
    for (const WorkerIteration& w : run.iterations[i]) {
      last_ready = std::max(last_ready, w.ready_us);
      last_done = std::max(last_done, w.done_us);
      if (i > 0) run.communication_ms.push_back((w.done_us - w.ready_us) / 1e3);
    }
    if (i > 0) {
      run.critical_ms.push_back((last_done - last_ready) / 1e3);
      run.iteration_ms.push_back((last_done - previous_done) / 1e3);
      run.link_bound_ms.push_back(iteration_link_bound_ms(run.iterations[i], links));
    }
    previous_done = last_done;
  }
  run.iterations.erase(run.iterations.begin());
  return run;
}

// Each 16-bit system's median critical path against its 32-bit variant's and the other 16-bit systems'.
void print_wire_ratios(const std::vector<SystemRun>& runs) {
  for (const SystemRun& run : runs) {
    if (hetero_system(run.system).wire_bits != 16) continue;
    std::vector<std::string> ratios;
    for (const SystemRun& other : runs) {
      const bool compared = hetero_system(other.system).wire_bits == 16 || other.system + "16" == run.system;
      const double critical = percentile(other.critical_ms, 0.5);
      if (&other != &run && compared && critical > 0)
        ratios.push_back(fmt::format("{:.2f}x {}'s", percentile(run.critical_ms, 0.5) / critical, other.system));
    }
    if (!ratios.empty()) fmt::print("# {} median critical path: {}\n", run.system, fmt::join(ratios, ", "));
  }
}

json to_json(const Scenario& scenario, const std::vector<SystemRun>& runs) {
  json systems = json::array();
  for (const SystemRun& run : runs) {
    json iterations = json::array();
    for (const auto& workers : run.iterations) {
      json row = json::array();
      for (const WorkerIteration& w : workers)
        row.push_back({{"start_us", w.start_us},
                       {"first_ready_us", w.first_ready_us},
                       {"ready_us", w.ready_us},
                       {"done_us", w.done_us}});
      iterations.push_back(row);
    }
    systems.push_back({{"system", run.system},
                       {"wire_bits", hetero_system(run.system).wire_bits},
                       {"median_communication_ms", percentile(run.communication_ms, 0.5)},
                       {"median_critical_ms", percentile(run.critical_ms, 0.5)},
                       {"median_iteration_ms", percentile(run.iteration_ms, 0.5)},
                       {"median_link_bound_ms", percentile(run.link_bound_ms, 0.5)},
                       {"round_median_critical_ms", run.round_critical_ms},
                       {"round", run.round},
                       {"communication_ms", run.communication_ms},
                       {"critical_ms", run.critical_ms},
                       {"iteration_ms", run.iteration_ms},
                       {"link_bound_ms", run.link_bound_ms},
                       {"competing_flow_gbit", run.flow_gbit()},
                       {"iterations", iterations}});
  }
  return {{"scenario", scenario.name}, {"workers", scenario.workers}, {"model", scenario.model},
          {"gradient_scale", scenario.gradient_scale}, {"compute_ms", scenario.compute_ms},
          {"worker_gbit", scenario.worker_gbit}, {"aggregators", scenario.layout.to_string()},
          {"aggregator_gbit", scenario.aggregator_gbit}, {"loss", scenario.loss}, {"mtu", scenario.mtu}, {"systems", systems}};
}

void write_csv(std::ofstream& out, const Scenario& scenario, const std::vector<SystemRun>& runs) {
  out << "scenario,system,round,iteration,worker,start_us,first_ready_us,ready_us,done_us,communication_ms,"
         "critical_ms,iteration_ms,link_bound_ms\n";
  for (const SystemRun& run : runs) {
    const size_t per_round = run.iterations.size() / run.round_critical_ms.size();
    for (size_t i = 0; i < run.iterations.size(); ++i)
      for (size_t w = 0; w < run.iterations[i].size(); ++w) {
        const WorkerIteration& it = run.iterations[i][w];
        out << fmt::format("{},{},{},{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f}\n", scenario.name, run.system,
                           run.round[i], i % per_round + 1, w, it.start_us, it.first_ready_us, it.ready_us,
                           it.done_us, (it.done_us - it.ready_us) / 1e3, run.critical_ms[i], run.iteration_ms[i],
                           run.link_bound_ms[i]);
      }
  }
}

void plot(const BenchOptions& options, const json& results) {
  std::optional<fs::path> script = find_script("plot_hetero.py");
  if (!script)
    throw std::runtime_error("scripts/plot_hetero.py not found above this binary, in its source tree or installed");
  fs::create_directories(options.plots_dir);
  fs::path data = fs::path(options.plots_dir) / (results.at("scenario").get<std::string>() + ".json");
  std::ofstream out = open_output(data);
  out << results.dump(1);
  close_output(out, data);
  xagg::run_command({"/usr/bin/python3", script->string(), data.string(), options.plots_dir},
                       std::chrono::seconds(120));
}

// `--aggregators` on a scenario written for another layout: its aggregator
// rate, if one for all, applies to each of the new dedicated aggregators.
void override_layout(Scenario& scenario, const testbed::Layout& layout) {
  if (layout.automatic) {  // the planner chooses among the scenario's aggregator hosts
    if (scenario.layout.colocated) scenario.aggregator_gbit.clear();
    scenario.layout = {.aggregators = static_cast<uint32_t>(scenario.aggregator_gbit.size()), .colocated = false,
                       .routed = false, .two_level = false, .automatic = true};
    return;
  }
  const bool one_rate = std::ranges::adjacent_find(scenario.aggregator_gbit, std::not_equal_to<>()) ==
                        scenario.aggregator_gbit.end();
  if (!one_rate)
    throw std::runtime_error(fmt::format("--aggregators {}: the scenario gives its {} aggregators different rates",
                                         layout.to_string(), scenario.aggregator_gbit.size()));
  const double gbit = scenario.aggregator_gbit.empty() ? 0 : scenario.aggregator_gbit.front();
  scenario.layout = layout;
  scenario.aggregator_gbit.assign(layout.colocated ? 0 : layout.aggregators, gbit);
  try {
    testbed::check_congestion_fields(scenario);
  } catch (const std::runtime_error& error) {
    throw std::runtime_error(fmt::format("--aggregators {}: {}", layout.to_string(), error.what()));
  }
}

json mark_json(const testbed::MarkCounters& counters) {
  return {{"frames", counters.seen}, {"ect_frames", counters.ect}, {"marked", counters.marked},
          {"max_queue_bytes", counters.max_queue_bytes}};
}

// Prints the loss injected over the whole run, in wire frames; the JSON has it per link and direction.
json report_loss(const testbed::ScenarioNetwork& network) {
  const auto* impairment = network.impairment();
  if (!impairment) return nullptr;
  const testbed::LossCounters total = impairment->counters();
  fmt::print("# loss injected: {} of {} wire frames ({:.3f}%) in {} loss events; {} skbs of several frames\n",
             total.dropped, total.seen, total.rate() * 100, total.drop_events, total.multi_frame_skbs);
  return impairment->report();
}

// Stops the competing flows and prints what they and the ECN markers did over the whole run.
json report_congestion(const Scenario& scenario, testbed::ScenarioNetwork& network) {
  json flows = json::array(), markings = json::array();
  for (const auto& flow : network.flows()) {
    const testbed::FlowReport report = flow->stop();
    fmt::print("# competing flow {}: {:.2f} GB in {:.1f} s, {:.3f} Gbit/s over the whole run{}\n", flow->label(),
               double(report.bytes) / 1e9, report.seconds, report.gbit(),
               report.error.empty() ? "" : " -- BROKE: " + report.error);
    flows.push_back({{"flow", flow->label()}, {"bytes", report.bytes}, {"seconds", report.seconds},
                     {"gbit", report.gbit()}, {"error", report.error}});
  }
  for (size_t i = 0; i < network.markings().size(); ++i) {
    const testbed::LinkMarking& marking = *network.markings()[i];
    const testbed::MarkCounters up = marking.from_host(), down = marking.to_host();
    fmt::print("# ECN on {}'s link: from the host {} of {} ECT frames marked, to it {} of {}; phantom queue at "
               "most {:.0f} / {:.0f} KB\n",
               marking.link().to_string(), up.marked, up.ect, down.marked, down.ect, up.max_queue_bytes / 1e3,
               down.max_queue_bytes / 1e3);
    markings.push_back({{"link", marking.link().to_string()}, {"threshold_kb", scenario.ecn_marking[i].threshold_kb},
                        {"rate_fraction", scenario.ecn_marking[i].rate_fraction},
                        {"from_host", mark_json(up)}, {"to_host", mark_json(down)}});
  }
  return {{"competing_flows", flows}, {"ecn_marking", markings}};
}

void run_bench(const BenchOptions& options) {
  Scenario scenario = load_scenario(options.scenario);
  if (!options.systems.empty()) scenario.systems = options.systems;
  if (options.wire_bits) scenario.wire_bits = *options.wire_bits;
  if (!options.aggregators.empty()) override_layout(scenario, testbed::Layout::parse(options.aggregators));
  if (options.loss) scenario.loss = *options.loss;
  // Refuses unknown names before any run.
  scenario.systems = systems_at_wire_bits(kSystems, scenario.systems, scenario.wire_bits);
  auto buckets = backward_buckets(trace_file(options.scenario, scenario.model), scenario.gradient_scale,
                                  scenario.bucket_mb);
  uint64_t total = 0;
  for (uint64_t b : buckets) total += b;
  const bool planned = scenario.layout.automatic;
  if (planned) {
    const plan::Plan layouts = plan::plan_scenario(scenario, buckets);
    fmt::print("# aggregators auto: the plan from the scenario's links (xagg plan)\n");
    std::istringstream table(plan::plan_table(layouts));
    for (std::string line; std::getline(table, line);) fmt::print("#   {}\n", line);
  }

  std::optional<std::ofstream> json_out, csv_out;
  if (!options.json_file.empty()) json_out = open_output(options.json_file);
  if (!options.csv_file.empty()) csv_out = open_output(options.csv_file);

  testbed::Testbed bed(options.prefix);
  const xagg::InterruptGuard interrupts;  // Ctrl-C stops the workers and removes the testbed
  testbed::TeardownGuard teardown(bed);
  bed.up(scenario.workers, scenario.layout, scenario.mtu);
  testbed::ScenarioNetwork network(bed, scenario);
  testbed::Cluster cluster(fs::read_symlink("/proc/self/exe"), bed);

  fmt::print("# scenario {}: {} workers, {} ({} buckets, {:.1f} MB per iteration), compute ms [{}], "
             "worker Gbit/s [{}], aggregators {}{}, loss {}\n",
             scenario.name, scenario.workers, scenario.model, buckets.size(), total * 4 / 1e6,
             fmt::join(scenario.compute_ms, ", "), fmt::join(scenario.worker_gbit, ", "), scenario.layout.to_string(),
             scenario.layout.colocated ? " (sharing the workers' host links)"
                                       : fmt::format(" at [{}] Gbit/s", fmt::join(scenario.aggregator_gbit, ", ")),
             scenario.loss);
  if (std::vector<uint32_t> weights = scenario_weights(scenario); !weights.empty())
    fmt::print("# {} weight their aggregators by the link rates: [{}]\n",
               scenario.layout.two_level ? "the TCP PS shards" : "XAgg and the TCP PS", fmt::join(weights, ", "));
  if (!scenario.competing_flows.empty()) {
    std::vector<std::string> labels;
    for (const auto& flow : scenario.competing_flows) labels.push_back(flow.label());
    fmt::print("# competing bulk TCP flows for the whole run: {}; their goodput during each system's timed "
               "iterations is in the table\n",
               fmt::join(labels, ", "));
  }
  for (const auto& marking : scenario.ecn_marking)
    fmt::print("# ECN marking on {}'s link, both directions: CE above {} KB of a phantom queue draining at {}x "
               "{} Gbit/s\n",
               marking.link.to_string(), marking.threshold_kb, marking.rate_fraction,
               testbed::link_gbit(scenario, marking.link));
  fmt::print("# {} timed iterations per system and round after one warm-up, {} round(s) with the systems in turn; "
             "medians in ms\n",
             options.iterations, options.rounds);
  // Taking the systems in turn, round after round, spreads the machine's
  // slower and faster minutes over all of them.
  std::vector<SystemRun> runs(scenario.systems.size());
  for (uint32_t round = 0; round < options.rounds; ++round)
    for (size_t index = 0; index < scenario.systems.size(); ++index) {
      const SystemRun round_run = run_system(options, scenario, total, scenario.systems[index], cluster, bed);
      runs[index].add_flows(network.flows(), round_run);
      append_round(runs[index], round_run);
      if (options.rounds > 1)
        fmt::print("# round {} {}: critical path {:.1f}\n", round + 1, scenario.systems[index],
                   runs[index].round_critical_ms.back());
      std::fflush(stdout);
    }
  const bool flows = !network.flows().empty();
  fmt::print("{:>8} {:>14} {:>14} {:>12} {:>12} {:>12} {:>16}{}{}\n", "system", "comm(worker)", "critical-path",
             "p90 crit.", "link bound", "iteration", "crit. vs", flows ? "  competing Gbit/s" : "",
             options.rounds > 1 ? "  crit. per round" : "");
  const double reference = percentile(runs.front().critical_ms, 0.5);
  for (const SystemRun& run : runs) {
    const double critical = percentile(run.critical_ms, 0.5);
    fmt::print("{:>8} {:>14.1f} {:>14.1f} {:>12.1f} {:>12.1f} {:>12.1f} {:>16}{}{}\n", run.system,
               percentile(run.communication_ms, 0.5), critical, percentile(run.critical_ms, 0.9),
               percentile(run.link_bound_ms, 0.5), percentile(run.iteration_ms, 0.5),
               critical > 0 ? fmt::format("{} {:+.0f}%", runs.front().system, (reference / critical - 1) * 100) : "",
               flows ? fmt::format("  {:>16}", fmt::format("{:.3f}", fmt::join(run.flow_gbit(), "/"))) : "",
               options.rounds > 1 ? fmt::format("  {:.1f}", fmt::join(run.round_critical_ms, " ")) : "");
  }
  print_wire_ratios(runs);
  const json congestion = report_congestion(scenario, network);
  json results = to_json(scenario, runs);
  results.update(congestion);
  results["loss"] = report_loss(network);
  results["aggregators_planned"] = planned;
  if (json_out) {
    *json_out << results.dump(1) << "\n";
    close_output(*json_out, options.json_file);
  }
  if (csv_out) {
    write_csv(*csv_out, scenario, runs);
    close_output(*csv_out, options.csv_file);
  }
  if (!options.plots_dir.empty()) plot(options, results);
  for (const json& flow : congestion.at("competing_flows"))
    if (!flow.at("error").get<std::string>().empty())
      throw std::runtime_error(fmt::format("competing flow {} broke during the run ({}): the systems did not all "
                                           "meet the same load",
                                           flow.at("flow").get<std::string>(), flow.at("error").get<std::string>()));
}

}  // namespace

void add_hetero_command(CLI::App& bench) {
  auto options = std::make_shared<BenchOptions>();
  auto* command = bench.add_subcommand(
      "hetero", "Training iterations on a heterogeneous testbed: XAgg vs switch-style, TCP PS and Gloo");
  command->add_option("--scenario", options->scenario, "Scenario file (scenarios/*.json)")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("--iterations", options->iterations, "Timed iterations per system")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--rounds", options->rounds, "Run every system this many times, in turn")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--json", options->json_file, "Write every figure here");
  command->add_option("--csv", options->csv_file, "Write one row per iteration and worker here");
  command->add_option("--plots", options->plots_dir, "Write PNG plots (and the JSON they use) here");
  command
      ->add_option("--systems", options->systems,
                   fmt::format("Override the scenario's systems: {} (...16: 16 bits per element on the wire, "
                               "XAgg's 16-bit wire or Gloo's float16)",
                               fmt::join(system_names(kSystems), ", ")))
      ->delimiter(',');
  command
      ->add_option("--wire-bits", options->wire_bits,
                   "Override the scenario's bits per element on the wire, 32 or 16: at 16 every system that has "
                   "a 16-bit variant runs it (xagg as xagg16, gloo as gloo16; tcp-ps and the switch stay 32-bit)")
      ->check(CLI::IsMember({32, 16}));
  command->add_option("--loss", options->loss, "Override the scenario's loss rate per wire frame (0..1)")
      ->check(CLI::Range(0.0, 1.0));
  command->add_option("--aggregators", options->aggregators,
                      "Override the scenario's layout: K dedicated aggregators (1..64), colocated, two-level:L, or auto "
                      "(planned from the links among the scenario's aggregator hosts)");
  command->add_option("--prefix", options->prefix, "Testbed namespace prefix")->capture_default_str();
  command->add_option("--timeout-s", options->timeout_s, "Deadline per system")->capture_default_str();
  command->callback([options] { run_bench(*options); });

  auto worker = std::make_shared<WorkerOptions>();
  auto* rank = bench.add_subcommand("hetero-worker", "One rank of `xagg bench hetero` (started by it)");
  rank->add_option("--scenario", worker->scenario)->required();
  rank->add_option("--system", worker->system)->required();
  rank->add_option("--rank", worker->rank)->required();
  rank->add_option("--iterations", worker->iterations);
  rank->add_option("--server", worker->servers)->delimiter(',');
  rank->add_option("--server-weights", worker->server_weights)->delimiter(',');
  rank->add_option("--root-server", worker->root_server);
  rank->add_option("--ranks-per-leaf", worker->ranks_per_leaf);
  rank->add_option("--port", worker->port);
  rank->add_option("--rendezvous", worker->rendezvous);
  rank->add_option("--local-address", worker->local_address);
  rank->add_option("--netns", worker->netns);
  rank->add_option("--seed", worker->seed);
  rank->callback([worker] {
    if (!worker->netns.empty()) enter_netns(worker->netns);
    run_worker(*worker);
  });
}

}  // namespace xagg::bench
