// `xagg doctor`: checks a host before an aggregator serves on it and says
// what to fix (src/tools/host_checks.h has the checks).
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "host_checks.h"
#include "log_format.h"
#include "netns.h"

namespace xagg::tools {
namespace {

void print_lines(const std::vector<CheckResult>& results) {
  for (const CheckResult& result : results) {
    fmt::print("{:<4}  {:<16}  {}", to_string(result.status), result.name, result.found);
    if (!result.fix.empty()) fmt::print("  fix: {}", result.fix);
    fmt::print("\n");
  }
}

void print_json(const std::vector<CheckResult>& results, bool passed) {
  nlohmann::json checks = nlohmann::json::array();
  for (const CheckResult& result : results)
    checks.push_back(
        {{"check", result.name}, {"status", to_string(result.status)}, {"found", result.found}, {"fix", result.fix}});
  fmt::print("{}\n", nlohmann::json{{"ok", passed}, {"checks", checks}}.dump());
}

}  // namespace

void add_doctor_command(CLI::App& app) {
  auto* command =
      app.add_subcommand("doctor",
                         "Check this host before an aggregator serves on it (kernel, privileges, interface, MTU, XDP, "
                         "firewall, ...) and say what to fix; exit code 1 when a check fails");
  auto options = std::make_shared<HostCheckOptions>();
  auto netns = std::make_shared<std::string>();
  auto generic = std::make_shared<bool>(false);
  auto json = std::make_shared<bool>(false);
  command->add_option("--interface,-i", options->interface, "Interface the aggregator will attach XDP to")->required();
  command->add_option("--netns", *netns, "Network namespace (ip netns name) the aggregator will run in");
  command->add_option("--data-port", options->data_port, "UDP port of DATA packets")->capture_default_str();
  command->add_option("--control-port", options->control_port, "TCP port of the control endpoint")
      ->capture_default_str();
  command->add_flag("--generic", *generic, "Check generic (skb) XDP, the mode of `xagg aggregator --generic`");
  command->add_flag("--json", *json, "One JSON object: {\"ok\": bool, \"checks\": [...]}");
  command->callback([=] {
    if (!netns->empty()) enter_netns(*netns);  // first: every check looks at the namespace's view
    // The report owns stdout; libbpf's and the data plane's messages go to stderr.
    log_to_stderr();
    options->mode = *generic ? dataplane::AttachMode::Generic : dataplane::AttachMode::Native;
    const std::vector<CheckResult> results = check_host(*options);
    const bool passed =
        std::ranges::none_of(results, [](const CheckResult& result) { return result.status == CheckStatus::Fail; });
    if (*json)
      print_json(results, passed);
    else
      print_lines(results);
    if (!passed) throw CLI::RuntimeError(1);  // exit code 1, nothing more printed
  });
}

}  // namespace xagg::tools
