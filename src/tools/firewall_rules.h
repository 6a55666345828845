// What `xagg doctor` understands of a host's packet filter: the rules that
// drop or accept a TCP or UDP destination port on the way in, read from
// `nft -j list ruleset` or `iptables-save`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xagg::tools {

enum class Verdict { Accept, Drop, Reject, Other };  // Other: jump, return, log only, ...

struct FirewallRule {
  std::string where;           // "inet filter input handle 4", "filter INPUT rule 3"
  std::string delete_command;  // removes exactly this rule
  Verdict verdict = Verdict::Other;
  std::string protocol;                                          // "tcp", "udp", or empty: any (nft "th" too)
  std::vector<std::pair<uint16_t, uint16_t>> destination_ports;  // inclusive ranges; empty: any port
  bool ports_negated = false;                                    // matches every port but those
  bool other_conditions = false;  // addresses, interfaces, conntrack state, ...: matches only some packets

  // True when the rule applies to `protocol` packets to `port`, all of them
  // or (other_conditions) some.
  bool matches(std::string_view packet_protocol, uint16_t port) const;
  bool names_port() const { return !destination_ports.empty(); }
};

// A chain that incoming packets can pass: a base chain on a receiving hook
// (input, prerouting, ingress), or a regular chain one may jump to. Chains on
// sending or forwarding hooks are left out.
struct FirewallChain {
  std::string where;                // "inet filter input", "filter INPUT"
  bool policy_drop = false;         // a base chain that drops what no rule accepts
  std::string accept_command;       // appends an accept for a port: fmt with {protocol} and {port}
  std::vector<FirewallRule> rules;  // in evaluation order
};

// Throws std::runtime_error when the text is not nft's JSON.
std::vector<FirewallChain> parse_nft_json(std::string_view json);
std::vector<FirewallChain> parse_iptables_save(std::string_view text);

// What happens to new connections or datagrams to a port, as far as the rules tell.
struct PortVerdict {
  const FirewallRule* blocking_rule = nullptr;  // the first rule that drops or rejects them
  const FirewallChain* chain = nullptr;         // its chain, or the chain whose policy drops them
  bool by_policy = false;                       // no rule decides, and the chain's policy drops them
};
// nullopt when nothing drops them. A rule that accepts every such packet
// before a dropping one ends the search in its chain.
std::optional<PortVerdict> find_blocking(const std::vector<FirewallChain>& chains, std::string_view protocol,
                                         uint16_t port);

}  // namespace xagg::tools
