#include "firewall_rules.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

namespace xagg::tools {
namespace {

using nlohmann::json;
using PortRanges = std::vector<std::pair<uint16_t, uint16_t>>;

// Hooks that see only packets this host sends or forwards.
bool sending_hook(std::string_view hook) {
  return hook == "output" || hook == "postrouting" || hook == "forward" || hook == "egress" || hook == "OUTPUT" ||
         hook == "POSTROUTING" || hook == "FORWARD";
}

void add_port_value(const json& value, PortRanges& ports) {
  if (value.is_number_unsigned()) {
    auto port = value.get<uint16_t>();
    ports.emplace_back(port, port);
  } else if (value.is_object() && value.contains("range")) {
    ports.emplace_back(value["range"][0].get<uint16_t>(), value["range"][1].get<uint16_t>());
  } else if (value.is_object() && value.contains("set")) {
    for (const json& element : value["set"]) add_port_value(element, ports);
  } else {
    throw std::runtime_error(fmt::format("unexpected port value {}", value.dump()));
  }
}

bool is_protocol_name(const json& value) { return value.is_string() && (value == "tcp" || value == "udp"); }

// One expression of an nft rule, applied to the rule being built.
void apply_nft_expression(const json& expression, FirewallRule& rule) {
  static const std::map<std::string, Verdict> kVerdicts{
      {"accept", Verdict::Accept}, {"drop", Verdict::Drop}, {"reject", Verdict::Reject}};
  static const std::set<std::string> kOtherVerdicts{"jump", "goto", "return", "continue", "queue"};
  static const std::set<std::string> kNeutral{"counter", "log"};  // they neither match nor decide
  const auto& [key, body] = *expression.items().begin();
  if (auto verdict = kVerdicts.find(key); verdict != kVerdicts.end()) {
    rule.verdict = verdict->second;
  } else if (kOtherVerdicts.contains(key)) {
    rule.verdict = Verdict::Other;
  } else if (key == "match") {
    const json& left = body["left"];
    const std::string op = body.value("op", "==");
    const bool equality = op == "==" || op == "in" || op == "!=";
    const json* payload = left.contains("payload") ? &left["payload"] : nullptr;
    if (equality && payload && payload->value("field", "") == "dport") {
      std::string protocol = payload->value("protocol", "");
      if (protocol == "tcp" || protocol == "udp") rule.protocol = protocol;
      add_port_value(body["right"], rule.destination_ports);
      rule.ports_negated = op == "!=";
    } else if (op != "!=" && is_protocol_name(body["right"]) &&
               ((left.contains("meta") && left["meta"].value("key", "") == "l4proto") ||
                (payload && payload->value("field", "") == "protocol"))) {
      rule.protocol = body["right"].get<std::string>();
    } else {
      rule.other_conditions = true;
    }
  } else if (!kNeutral.contains(key)) {
    rule.other_conditions = true;  // limit, quota, ...: conservatively, only some packets
  }
}

// "--dport 9988", "--dport 9000:10000", "--dports 22,9987:9988".
PortRanges parse_iptables_ports(std::string_view text) {
  PortRanges ports;
  auto number = [](std::string_view digits) {
    uint16_t value = 0;
    auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (error != std::errc() || end != digits.data() + digits.size())
      throw std::runtime_error(fmt::format("unexpected port '{}' in iptables-save output", digits));
    return value;
  };
  while (!text.empty()) {
    std::string_view item = text.substr(0, text.find(','));
    text.remove_prefix(std::min(text.size(), item.size() + 1));
    size_t colon = item.find(':');
    if (colon == std::string_view::npos)
      ports.emplace_back(number(item), number(item));
    else
      ports.emplace_back(number(item.substr(0, colon)), number(item.substr(colon + 1)));
  }
  return ports;
}

// Words of a rule line; a double-quoted word (a comment) is one word.
std::vector<std::string> split_words(const std::string& line) {
  std::vector<std::string> words;
  std::istringstream stream(line);
  std::string word;
  while (stream >> std::quoted(word)) words.push_back(word);
  return words;
}

}  // namespace

bool FirewallRule::matches(std::string_view packet_protocol, uint16_t port) const {
  if (!protocol.empty() && protocol != packet_protocol) return false;
  if (destination_ports.empty()) return true;
  bool listed =
      std::ranges::any_of(destination_ports, [&](auto range) { return range.first <= port && port <= range.second; });
  return listed != ports_negated;
}

std::vector<FirewallChain> parse_nft_json(std::string_view text) {
  json document = json::parse(text);
  if (!document.contains("nftables")) throw std::runtime_error("no \"nftables\" array in nft's JSON output");
  std::vector<FirewallChain> chains;
  std::map<std::string, size_t> chain_index;  // "family table chain" -> chains[]
  for (const json& object : document["nftables"]) {
    if (object.contains("chain")) {
      const json& chain = object["chain"];
      if (sending_hook(chain.value("hook", ""))) continue;
      std::string where = fmt::format("{} {} {}", chain["family"].get<std::string>(), chain["table"].get<std::string>(),
                                      chain["name"].get<std::string>());
      chain_index[where] = chains.size();
      chains.push_back({where,
                        chain.value("policy", "") == "drop",
                        fmt::format("nft add rule {} {{protocol}} dport {{port}} accept", where),
                        {}});
    } else if (object.contains("rule")) {
      const json& rule_json = object["rule"];
      std::string chain_where =
          fmt::format("{} {} {}", rule_json["family"].get<std::string>(), rule_json["table"].get<std::string>(),
                      rule_json["chain"].get<std::string>());
      auto chain = chain_index.find(chain_where);
      if (chain == chain_index.end()) continue;  // a chain of a sending hook
      FirewallRule rule;
      rule.where = fmt::format("{} handle {}", chain_where, rule_json["handle"].get<uint64_t>());
      rule.delete_command = "nft delete rule " + rule.where;
      for (const json& expression : rule_json["expr"]) apply_nft_expression(expression, rule);
      chains[chain->second].rules.push_back(std::move(rule));
    }
  }
  return chains;
}

std::vector<FirewallChain> parse_iptables_save(std::string_view text) {
  std::vector<FirewallChain> chains;
  std::map<std::string, size_t> chain_index;  // "table CHAIN" -> chains[]
  std::string table;
  std::istringstream lines{std::string(text)};
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with('*')) {
      table = line.substr(1);
    } else if (line.starts_with(':')) {  // ":INPUT DROP [0:0]"; a user chain's policy is "-"
      std::vector<std::string> words = split_words(line.substr(1));
      if (words.size() < 2 || sending_hook(words[0])) continue;
      std::string where = fmt::format("{} {}", table, words[0]);
      chain_index[where] = chains.size();
      chains.push_back({where,
                        words[1] == "DROP",
                        fmt::format("iptables -t {} -A {} -p {{protocol}} --dport {{port}} -j ACCEPT", table, words[0]),
                        {}});
    } else if (line.starts_with("-A ")) {
      std::vector<std::string> words = split_words(line);
      if (words.size() < 2) continue;
      auto chain = chain_index.find(fmt::format("{} {}", table, words[1]));
      if (chain == chain_index.end()) continue;
      FirewallRule rule;
      rule.where = fmt::format("{} {} rule {}", table, words[1], chains[chain->second].rules.size() + 1);
      rule.delete_command = fmt::format("iptables -t {} -D {}", table, line.substr(3));
      bool negate_next = false;
      for (size_t i = 2; i < words.size(); ++i) {
        const std::string& word = words[i];
        const std::string* value = i + 1 < words.size() ? &words[i + 1] : nullptr;
        if (word == "!") {
          negate_next = true;
          continue;
        }
        if ((word == "-p" || word == "--protocol") && value) {
          if (negate_next)
            rule.other_conditions = true;
          else
            rule.protocol = *value;
          ++i;
        } else if ((word == "--dport" || word == "--dports" || word == "--destination-port" ||
                    word == "--destination-ports") &&
                   value) {
          rule.destination_ports = parse_iptables_ports(*value);
          rule.ports_negated = negate_next;
          ++i;
        } else if ((word == "-j" || word == "--jump") && value) {
          rule.verdict = *value == "ACCEPT"   ? Verdict::Accept
                         : *value == "DROP"   ? Verdict::Drop
                         : *value == "REJECT" ? Verdict::Reject
                                              : Verdict::Other;
          break;  // what follows are the target's options (--reject-with ...)
        } else if (word == "-m" || word == "--match") {
          ++i;  // the module name; its options follow and are judged one by one
        } else if (word == "--comment") {
          ++i;
        } else if (word.starts_with("-")) {
          rule.other_conditions = true;  // -s, -i, --ctstate, ...
        }
        negate_next = false;
      }
      chains[chain->second].rules.push_back(std::move(rule));
    }
  }
  return chains;
}

std::optional<PortVerdict> find_blocking(const std::vector<FirewallChain>& chains, std::string_view protocol,
                                         uint16_t port) {
  for (const FirewallChain& chain : chains) {
    bool accepted = false;       // every such packet accepted before any drop
    bool some_accepted = false;  // a rule lets some of them in (from some addresses, say)
    for (const FirewallRule& rule : chain.rules) {
      if (!rule.matches(protocol, port)) continue;
      if (rule.verdict == Verdict::Accept) {
        accepted = !rule.other_conditions;
        some_accepted = some_accepted || rule.names_port();
        if (accepted) break;
      } else if ((rule.verdict == Verdict::Drop || rule.verdict == Verdict::Reject) &&
                 (rule.names_port() || !rule.other_conditions)) {
        return PortVerdict{&rule, &chain, false};
      }
    }
    if (!accepted && !some_accepted && chain.policy_drop) return PortVerdict{nullptr, &chain, true};
  }
  return std::nullopt;
}

}  // namespace xagg::tools
