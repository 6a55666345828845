// `xagg testbed up|down|status|flow`: the network-namespace testbed (src/testbed).
#include <fmt/format.h>

#include <stdexcept>

#include <chrono>
#include <thread>

#include "commands.h"
#include "competing_flow.h"
#include "planner.h"
#include "scenario.h"
#include "testbed.h"

namespace xagg::tools {
namespace {

// `--aggregators auto`: the plan's choice for the scenario's cluster, whose
// worker count is the testbed's (a --workers given as well must agree).
void plan_testbed_layout(const std::string& scenario_file, bool workers_given, uint32_t& workers,
                         testbed::Layout& layout) {
  if (scenario_file.empty())
    throw std::invalid_argument("--aggregators auto plans from a cluster's links: give --scenario FILE");
  const plan::PlannedScenario planned = plan::plan_scenario_file(scenario_file);
  if (workers_given && workers != planned.scenario.workers)
    throw std::invalid_argument(fmt::format("--workers {}: the scenario has {} workers", workers,
                                            planned.scenario.workers));
  workers = planned.scenario.workers;
  layout = planned.scenario.layout;
  fmt::print("{}", plan::plan_table(planned.plan));
}

}  // namespace

void add_testbed_command(CLI::App& app) {
  auto* testbed = app.add_subcommand("testbed", "Create or remove the network-namespace testbed");
  testbed->require_subcommand(1);
  auto prefix = std::make_shared<std::string>("xagg");
  auto workers = std::make_shared<uint32_t>(2);
  auto aggregators = std::make_shared<std::string>("1");
  auto mtu = std::make_shared<uint32_t>(testbed::kLinkMtu);

  auto* up = testbed->add_subcommand("up", "Create (or complete) the bridge, aggregator and worker namespaces");
  up->add_option("--workers", *workers, "Number of worker namespaces")
      ->check(CLI::Range(1u, testbed::kMaxWorkers));
  up->add_option("--aggregators", *aggregators,
                 "Dedicated aggregator hosts (1..64), \"colocated\": one aggregator on every worker host, "
                 "\"routed\": one aggregator, the workers on two subnets behind a router, \"two-level:L\": L leaf "
                 "aggregators and a root, or \"auto\": planned from --scenario's links (xagg plan)")
      ->check(CLI::Validator(
          [](std::string& text) {
            try {
              testbed::Layout::parse(text);
              return std::string();
            } catch (const std::invalid_argument& error) {
              return std::string(error.what());
            }
          },
          "K|colocated|routed|two-level:L|auto"));
  up->add_option("--mtu", *mtu, "Every link's MTU")
      ->check(CLI::Range(testbed::kMinTestbedMtu, testbed::kMaxTestbedMtu))
      ->capture_default_str();
  up->add_option("--prefix", *prefix, "Namespace name prefix");
  auto scenario = std::make_shared<std::string>();
  auto* workers_option = up->get_option("--workers");
  up->add_option("--scenario", *scenario, "With --aggregators auto: the cluster to plan for (its links, compute, model)")
      ->check(CLI::ExistingFile);
  up->callback([=] {
    testbed::Testbed bed(*prefix);
    testbed::Layout layout = testbed::Layout::parse(*aggregators);
    if (layout.automatic)
      plan_testbed_layout(*scenario, workers_option->count() > 0, *workers, layout);
    else if (!scenario->empty())
      throw std::invalid_argument("--scenario is read only to plan --aggregators auto");
    // Another shape under this prefix is someone's testbed: rebuilding it would cut their run off.
    if (auto present = bed.existing_workers(); present && (*present != *workers || bed.existing_layout() != layout))
      throw std::runtime_error(fmt::format(
          "testbed {} is taken: it exists with {} workers, aggregators {}; give another --prefix, or remove it "
          "first (xagg testbed down --prefix {})",
          *prefix, *present, bed.layout().to_string(), *prefix));
    bed.up(*workers, layout, *mtu);
  });

  auto* down = testbed->add_subcommand("down", "Remove every namespace of the prefix");
  down->add_option("--prefix", *prefix, "Namespace name prefix");
  down->callback([=] { testbed::Testbed(*prefix).down(); });

  auto* flow = testbed->add_subcommand(
      "flow", "Run a bulk TCP flow between two hosts of an existing testbed and report its goodput");
  auto from = std::make_shared<std::string>(), to = std::make_shared<std::string>();
  auto seconds = std::make_shared<double>(10);
  flow->add_option("--from", *from, "Sending host: \"worker I\" or \"aggregator K\"")->required();
  flow->add_option("--to", *to, "Receiving host")->required();
  flow->add_option("--seconds", *seconds, "How long it runs")->check(CLI::PositiveNumber)->capture_default_str();
  flow->add_option("--prefix", *prefix, "Namespace name prefix");
  flow->callback([=] {
    testbed::Testbed bed(*prefix);
    const auto workers = bed.existing_workers();
    if (!workers) throw std::runtime_error(fmt::format("testbed {} is down (xagg testbed up --prefix {})", *prefix, *prefix));
    const testbed::CompetingFlowSpec spec{testbed::HostRef::parse(*from), testbed::HostRef::parse(*to)};
    testbed::check_competing_flow(spec, *workers, bed.layout());
    testbed::CompetingFlow running(bed.host(spec.from), bed.host(spec.to), spec.label());
    std::this_thread::sleep_for(std::chrono::duration<double>(*seconds));
    const testbed::FlowReport report = running.stop();
    fmt::print("{}: {} bytes in {:.2f} s, {:.3f} Gbit/s\n", spec.label(), report.bytes, report.seconds, report.gbit());
    if (!report.error.empty()) throw std::runtime_error(fmt::format("the flow broke: {}", report.error));
  });

  auto* status = testbed->add_subcommand("status", "List the testbed's namespaces and addresses");
  status->add_option("--prefix", *prefix, "Namespace name prefix");
  status->callback([=] {
    testbed::Testbed bed(*prefix);
    auto workers_present = bed.existing_workers();
    if (!workers_present) {
      fmt::print("testbed {}: down ({} stray namespaces)\n", *prefix, bed.existing_namespaces().size());
      return;
    }
    const testbed::Layout layout = bed.layout();
    fmt::print("testbed {}: {} workers, aggregators {}\n", *prefix, *workers_present, layout.to_string());
    std::vector<testbed::HostLink> hosts;
    for (uint32_t k = 0; k < bed.aggregator_count(); ++k) hosts.push_back(bed.aggregator(k));
    for (uint32_t i = 0; i < *workers_present; ++i) hosts.push_back(bed.worker(i));
    for (uint32_t i = 0; layout.colocated && i < *workers_present; ++i) hosts.push_back(bed.host_uplink(i));
    for (const auto& host : hosts)
      fmt::print("  {:<20} {:<15} {} <-> {} port {}\n", host.netns, host.address.empty() ? "-" : host.address,
                 host.interface, host.bridge_netns, host.bridge_port);
  });
}

}  // namespace xagg::tools
