// `xagg testbed up|down|status`: the network-namespace testbed (src/testbed).
#include <fmt/format.h>

#include "commands.h"
#include "testbed.h"

namespace xagg::tools {

void add_testbed_command(CLI::App& app) {
  auto* testbed = app.add_subcommand("testbed", "Create or remove the network-namespace testbed");
  testbed->require_subcommand(1);
  auto prefix = std::make_shared<std::string>("xagg");
  auto workers = std::make_shared<uint32_t>(2);

  auto* up = testbed->add_subcommand("up", "Create (or complete) the bridge, aggregator and worker namespaces");
  up->add_option("--workers", *workers, "Number of worker namespaces")->check(CLI::Range(1, 64));
  up->add_option("--prefix", *prefix, "Namespace name prefix");
  up->callback([=] { testbed::Testbed(*prefix).up(*workers); });

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
    fmt::print("testbed {}: {} workers\n", *prefix, *workers_present);
    std::vector<testbed::HostLink> hosts{bed.aggregator()};
    for (uint32_t i = 0; i < *workers_present; ++i) hosts.push_back(bed.worker(i));
    for (const auto& host : hosts)
      fmt::print("  {:<20} {:<15} bridge port {}\n", host.netns, host.address, host.bridge_port);
  });
}

}  // namespace xagg::tools
