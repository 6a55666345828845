// `xagg testbed up|down|status`: the network-namespace testbed (src/testbed).
#include <fmt/format.h>

#include <stdexcept>

#include "commands.h"
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
  up->add_option("--workers", *workers, "Number of worker namespaces")->check(CLI::Range(1, 64));
  up->add_option("--aggregators", *aggregators,
                 "Dedicated aggregator hosts (1..64), or \"colocated\": one aggregator on every worker host")
      ->check(CLI::Validator(
          [](std::string& text) {
            try {
              testbed::Layout::parse(text);
              return std::string();
            } catch (const std::invalid_argument& error) {
              return std::string(error.what());
            }
          },
          "K|colocated"));
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
