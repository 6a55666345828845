// The checks of `xagg doctor`: is this host (in the caller's network
// namespace) ready for an aggregator on an interface, and if not, what to fix.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dataplane.h"
#include "firewall_rules.h"
#include "wire.h"

namespace xagg::tools {

enum class CheckStatus { Ok, Warn, Fail };
std::string_view to_string(CheckStatus status);  // "OK", "WARN", "FAIL"

struct CheckResult {
  std::string name;  // "kernel", "mtu", "xdp native", ...
  CheckStatus status = CheckStatus::Ok;
  std::string found;  // what the check saw
  std::string fix;    // WARN and FAIL: the command or setting that fixes it
};

struct HostCheckOptions {
  std::string interface;
  uint16_t data_port = wire::kDefaultDataPort;
  uint16_t control_port = wire::kDefaultControlPort;
  dataplane::AttachMode mode = dataplane::AttachMode::Native;  // the mode the aggregator will use
};

// Runs every check in the caller's network namespace, in a fixed order. The
// XDP checks attach pass-through programs to the interface and detach them
// again (bpf_links: nothing stays attached even if the process dies).
std::vector<CheckResult> check_host(const HostCheckOptions& options);

// The firewall part of check_host on rules already read: one result for the
// control port, one for the data port. `tool` names where they came from.
std::vector<CheckResult> check_firewall_rules(const std::vector<FirewallChain>& chains, std::string_view tool,
                                              uint16_t data_port, uint16_t control_port);

}  // namespace xagg::tools
