// `xagg testbed up|down|status|flow`: the network-namespace testbed (src/testbed).
#include <fmt/format.h>

#include <stdexcept>

#include <chrono>
#include <thread>

#include "commands.h"
#include "competing_flow.h"
#include "scenario.h"
#include "testbed.h"

namespace xagg::tools {

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
                 "\"routed\": one aggregator, the workers on two subnets behind a router, or \"two-level:L\": L leaf "
                 "aggregators and a root")
      ->check(CLI::Validator(
          [](std::string& text) {
            try {
              testbed::Layout::parse(text);
              return std::string();
            } catch (const std::invalid_argument& error) {
              return std::string(error.what());
            }
          },
          "K|colocated|routed|two-level:L"));
  up->add_option("--mtu", *mtu, "Every link's MTU")
      ->check(CLI::Range(testbed::kMinTestbedMtu, testbed::kMaxTestbedMtu))
      ->capture_default_str();
  up->add_option("--prefix", *prefix, "Namespace name prefix");
  up->callback([=] {
    testbed::Testbed bed(*prefix);
    const testbed::Layout layout = testbed::Layout::parse(*aggregators);
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
