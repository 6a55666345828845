// `xagg plan`: where to run a job's aggregators, from the hosts' link rates,
// the gradient and the compute skew (src/plan/planner.h; docs/operations.md,
// "Plan a deployment"). Prints the predicted critical path of every layout and
// of the ring, the choice, and the settings that realize it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "commands.h"
#include "output_file.h"
#include "planner.h"

namespace xagg::tools {
namespace {

struct PlanOptions {
  std::string scenario;
  uint32_t workers = 0;
  std::vector<double> worker_gbit;
  std::vector<double> compute_ms{0};
  std::vector<double> aggregator_gbit;
  double gradient_mb = 0;
  double bucket_mb = 25;  // DDP's default
  std::vector<std::string> aggregator_addresses;
  std::vector<std::string> worker_addresses;
  std::string json_file;
};

// One value for every worker, or one per worker.
std::vector<double> per_worker(const std::vector<double>& values, uint32_t workers, const char* option) {
  if (values.size() == 1) return std::vector<double>(workers, values.front());
  if (values.size() != workers)
    throw std::invalid_argument(
        fmt::format("{}: {} values for {} workers; give one for all or one per worker", option, values.size(), workers));
  return values;
}

plan::ClusterLinks cluster_from_flags(const PlanOptions& options) {
  if (options.workers == 0) throw std::invalid_argument("--workers is needed without --scenario");
  if (options.worker_gbit.empty()) throw std::invalid_argument("--worker-gbit is needed without --scenario");
  if (!(options.gradient_mb > 0) || !std::isfinite(options.gradient_mb))
    throw std::invalid_argument("--gradient-mb must be a positive number (the step's gradient, MB)");
  if (!(options.bucket_mb > 0) || !std::isfinite(options.bucket_mb))
    throw std::invalid_argument("--bucket-mb must be a positive number");
  plan::ClusterLinks cluster;
  cluster.worker_gbit = per_worker(options.worker_gbit, options.workers, "--worker-gbit");
  cluster.compute_ms = per_worker(options.compute_ms, options.workers, "--compute-ms");
  cluster.aggregator_gbit = options.aggregator_gbit;
  // Equal buckets as DDP fills them; the last one takes the rest.
  for (double left = options.gradient_mb * 1e6; left > 0; left -= options.bucket_mb * 1e6)
    cluster.bucket_bytes.push_back(std::min(left, options.bucket_mb * 1e6));
  return cluster;
}

// Addresses, when given, are one per host: a shorter list would print settings with a wrong host in them.
void check_addresses(const std::vector<std::string>& addresses, size_t hosts, const char* option, const char* host) {
  if (!addresses.empty() && addresses.size() != hosts)
    throw std::invalid_argument(fmt::format("{}: {} addresses for {} {}s", option, addresses.size(), hosts, host));
}

std::string address_of(const std::vector<std::string>& addresses, uint32_t index, const char* host) {
  return index < addresses.size() ? addresses[index] : fmt::format("<{} {}>", host, index);
}

// The commands and PyTorch settings that run the job in the chosen layout.
std::string settings(const plan::LayoutPlan& choice, const PlanOptions& options, uint32_t workers) {
  std::vector<std::string> aggregators;
  std::string where;
  if (choice.layout.colocated) {
    for (uint32_t i = 0; i < workers; ++i) aggregators.push_back(address_of(options.worker_addresses, i, "aggregator on worker host"));
    where = "one on every worker host, on a port of its own beside the worker (docs/design.md, \"Co-located\")";
  } else {
    for (uint32_t host : choice.hosts) aggregators.push_back(address_of(options.aggregator_addresses, host, "aggregator host"));
    where = fmt::format("on aggregator host{} {}", choice.hosts.size() > 1 ? "s" : "", fmt::join(choice.hosts, ", "));
  }
  std::string root;
  std::string per_leaf;
  if (choice.layout.two_level) {
    root = aggregators.back();
    aggregators.pop_back();
    per_leaf = std::to_string(choice.layout.ranks_per_leaf(workers));
  }
  const std::string list = fmt::format("{}", fmt::join(aggregators, ","));
  const std::string weights = choice.weights.empty() ? "" : fmt::format("{}", fmt::join(choice.weights, ","));
  std::string text = fmt::format("Aggregators: `xagg aggregator --interface <its NIC>` {}.\n", where);
  text += fmt::format("Every rank: xagg worker --aggregator {}", list);
  if (!weights.empty()) text += fmt::format(" --aggregator-weights {}", weights);
  if (!root.empty()) text += fmt::format(" --root-aggregator {} --ranks-per-leaf {}", root, per_leaf);
  text += fmt::format(" --world-size {} --rank R ...\n", workers);
  text += fmt::format("PyTorch: XAGG_AGGREGATOR={}", list);
  if (!weights.empty()) text += fmt::format(" XAGG_AGGREGATOR_WEIGHTS={}", weights);
  if (!root.empty()) text += fmt::format(" XAGG_ROOT_AGGREGATOR={} XAGG_RANKS_PER_LEAF={}", root, per_leaf);
  text += "\n";
  return text;
}

nlohmann::json layout_json(const plan::LayoutPlan& layout) {
  return {{"aggregators", layout.layout.aggregators == 0 && !layout.layout.colocated ? "ring" : layout.layout.to_string()},
          {"hosts", layout.hosts},
          {"aggregator_gbit", layout.aggregator_gbit},
          {"weights", layout.weights},
          {"critical_ms", layout.critical_ms},
          {"bottleneck", layout.bottleneck}};
}

void run_plan(const PlanOptions& options) {
  plan::Plan result;
  uint32_t workers = 0;
  size_t hosts = 0;
  if (!options.scenario.empty()) {
    plan::PlannedScenario planned = plan::plan_scenario_file(options.scenario);
    result = std::move(planned.plan);
    workers = planned.scenario.workers;
    hosts = planned.cluster.aggregator_gbit.size();
  } else {
    const plan::ClusterLinks cluster = cluster_from_flags(options);
    result = plan::make_plan(cluster);
    workers = cluster.workers();
    hosts = cluster.aggregator_gbit.size();
  }
  check_addresses(options.aggregator_addresses, hosts, "--aggregator-addresses", "aggregator host");
  check_addresses(options.worker_addresses, workers, "--worker-addresses", "worker host");
  fmt::print("{}", plan::plan_table(result));
  fmt::print("{}", settings(result.choice(), options, workers));
  if (!options.json_file.empty()) {
    nlohmann::json layouts = nlohmann::json::array();
    for (const auto& layout : result.layouts) layouts.push_back(layout_json(layout));
    const nlohmann::json json{{"layouts", layouts},
                              {"choice", layout_json(result.choice())},
                              {"ring", layout_json(result.ring)},
                              {"against_ring", plan::to_string(result.against_ring())}};
    std::ofstream out = open_output(options.json_file);
    out << json.dump(1) << "\n";
    close_output(out, options.json_file);
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  auto* command = app.add_subcommand(
      "plan", "Choose where a job's aggregators run from the hosts' link rates, the gradient and the compute skew");
  auto* scenario = command->add_option("--scenario", options->scenario,
                                       "A scenario file (scenarios/*.json) describing the cluster")
                       ->check(CLI::ExistingFile);
  const std::vector<CLI::Option*> flags{
      command->add_option("--workers", options->workers, "Worker hosts")->check(CLI::Range(2u, 250u)),
      command->add_option("--worker-gbit", options->worker_gbit,
                          "Each worker host's link, Gbit/s (one for all or one per worker; 0: not a limit)")
          ->delimiter(','),
      command->add_option("--compute-ms", options->compute_ms,
                          "Each worker's forward and backward time per step, ms (one for all or one per worker)")
          ->delimiter(','),
      command->add_option("--aggregator-gbit", options->aggregator_gbit,
                          "The link of each host free to be a dedicated aggregator, Gbit/s (none: co-located only)")
          ->delimiter(','),
      command->add_option("--gradient-mb", options->gradient_mb, "The step's gradient, MB (fp32: 4 bytes a parameter)"),
      command->add_option("--bucket-mb", options->bucket_mb, "The all-reduce bucket (DDP's bucket_cap_mb)")
          ->capture_default_str()};
  for (CLI::Option* flag : flags) flag->excludes(scenario);
  command->add_option("--aggregator-addresses", options->aggregator_addresses,
                      "The aggregator hosts' addresses, in --aggregator-gbit order (for the printed settings)")
      ->delimiter(',');
  command->add_option("--worker-addresses", options->worker_addresses,
                      "The co-located aggregators' addresses, one per worker host (for the printed settings)")
      ->delimiter(',');
  command->add_option("--json", options->json_file, "Write the plan here too");
  command->callback([options] { run_plan(*options); });
}

}  // namespace xagg::tools
