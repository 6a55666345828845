// `xagg switch-aggregator`: the switch-style (SwitchML) baseline's aggregator.
#include <CLI/CLI.hpp>

#include "netns.h"
#include "switch_aggregator.h"

namespace xagg::tools {

void add_switch_aggregator_command(CLI::App& app) {
  auto* command = app.add_subcommand("switch-aggregator", "Run the switch-style (SwitchML slot pool) baseline");
  auto options = std::make_shared<baselines::switchml::SwitchAggregatorOptions>();
  auto netns = std::make_shared<std::string>();
  command->add_option("--interface", options->interface, "Interface to attach XDP to")->capture_default_str();
  command->add_option("--port", options->data_port, "UDP data port")->capture_default_str();
  command->add_option("--control-port", options->control_port, "TCP control port")->capture_default_str();
  command->add_option("--slots", options->slots, "Pool size: the most slots a job may use")->capture_default_str();
  command->add_option("--broadcast", options->broadcast, "IPv4 address results are broadcast to")
      ->check(CLI::ValidIPV4)
      ->capture_default_str();
  command->add_option("--netns", *netns, "Network namespace (ip netns name) to run in");
  command->callback([=] {
    if (!netns->empty()) enter_netns(*netns);
    baselines::switchml::run_switch_aggregator(*options);
  });
}

}  // namespace xagg::tools
