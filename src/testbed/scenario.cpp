#include "scenario.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <type_traits>

#include "xagg_wire.h"

namespace xagg::testbed {

namespace {

const char* const kFields[] = {"name",       "workers",         "model",       "gradient_scale", "bucket_mb",
                               "compute_ms", "compute_jitter",  "aggregators", "worker_gbit",    "aggregator_gbit",
                               "loss",       "competing_flows", "ecn_marking", "systems",        "mtu",
                               "wire_bits"};

// Whether a JSON value is a T, stricter than nlohmann's conversions, which
// would take 2.9 or -1 for an unsigned field and true for a number.
template <typename T>
bool has_type(const nlohmann::json& value) {
  if constexpr (std::is_same_v<T, std::string>)
    return value.is_string();
  else if constexpr (std::is_same_v<T, uint32_t>)
    return value.is_number_unsigned() && value.get<uint64_t>() <= std::numeric_limits<uint32_t>::max();
  else if constexpr (std::is_same_v<T, double>)
    return value.is_number();  // a boolean is not
  else
    return value.is_array() && std::all_of(value.begin(), value.end(), has_type<typename T::value_type>);
}

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, std::string>)
    return "a string";
  else if constexpr (std::is_same_v<T, uint32_t>)
    return "an integer from 0 to 4294967295";
  else if constexpr (std::is_same_v<T, double>)
    return "a number";
  else
    return std::is_same_v<typename T::value_type, double> ? "an array of numbers" : "an array of strings";
}

// Field `key` of the object, or `fallback` where it is absent; throws "<key>: expected <type>".
template <typename T>
T field(const nlohmann::json& object, const char* key, T fallback) {
  const auto found = object.find(key);
  if (found == object.end()) return fallback;
  if (!has_type<T>(*found)) throw std::runtime_error(fmt::format("{}: expected {}", key, type_name<T>()));
  return found->get<T>();
}

// "aggregators": a count of dedicated aggregator hosts, "colocated", "routed", "two-level:L" or "auto".
Layout layout_field(const nlohmann::json& object) {
  const auto found = object.find("aggregators");
  if (found == object.end()) return {};
  const auto expected = fmt::format(
      "aggregators: expected an integer from 1 to {}, \"colocated\", \"routed\", \"two-level:L\" or \"auto\"",
      kMaxAggregators);
  if (found->is_string()) {
    std::optional<Layout> layout;
    try {
      layout = Layout::parse(found->get<std::string>());
    } catch (const std::invalid_argument& error) {
      throw std::runtime_error(fmt::format("{} ({})", expected, error.what()));
    }
    if (!layout->colocated && !layout->routed && !layout->two_level && !layout->automatic)
      throw std::runtime_error(expected);  // "3"
    return *layout;
  }
  if (!found->is_number_unsigned()) throw std::runtime_error(expected);
  const uint64_t count = found->get<uint64_t>();
  if (count < 1 || count > kMaxAggregators) throw std::runtime_error(expected);
  return {.aggregators = static_cast<uint32_t>(count), .colocated = false};
}

// "aggregator_gbit": one number for every dedicated aggregator, or one per aggregator.
// With "auto" it lists the hosts free to be dedicated aggregators, one entry
// (or one number) per host; absent, there are none and only the co-located
// layout is left.
std::vector<double> aggregator_gbit_field(const nlohmann::json& object, const Layout& layout) {
  const auto found = object.find("aggregator_gbit");
  if (layout.automatic) {
    if (found == object.end()) return {};
    if (has_type<double>(*found)) return {found->get<double>()};
    if (!has_type<std::vector<double>>(*found) || found->empty() || found->size() > kMaxAggregators)
      throw std::runtime_error(fmt::format(
          "aggregator_gbit: with \"aggregators\": \"auto\", expected a number (one host) or an array of 1 to {} "
          "numbers, one per host free to be a dedicated aggregator",
          kMaxAggregators));
    return found->get<std::vector<double>>();
  }
  if (found == object.end()) return std::vector<double>(layout.colocated ? 0 : layout.aggregators, 0.0);
  if (layout.colocated)
    throw std::runtime_error(
        "aggregator_gbit: not used with \"aggregators\": \"colocated\" (worker_gbit sets each host's link)");
  if (has_type<double>(*found)) return std::vector<double>(layout.aggregators, found->get<double>());
  if (!has_type<std::vector<double>>(*found))
    throw std::runtime_error("aggregator_gbit: expected a number or an array of numbers");
  auto rates = found->get<std::vector<double>>();
  if (rates.size() != layout.aggregators)
    throw std::runtime_error(fmt::format(
        "aggregator_gbit: {} entries, expected one per aggregator ({}) or one number for all", rates.size(),
        layout.aggregators));
  return rates;
}

// The objects of an array field, each with only the given keys; throws naming "<key>[i]".
template <typename Parse>
auto object_array_field(const nlohmann::json& object, const char* key, std::initializer_list<const char*> keys,
                        Parse parse) {
  std::vector<decltype(parse(object))> entries;
  const auto found = object.find(key);
  if (found == object.end()) return entries;
  if (!found->is_array()) throw std::runtime_error(fmt::format("{}: expected an array of objects", key));
  for (size_t i = 0; i < found->size(); ++i) {
    const nlohmann::json& entry = (*found)[i];
    try {
      if (!entry.is_object()) throw std::runtime_error("expected an object");
      for (const auto& [name, value] : entry.items())
        if (std::ranges::find(keys, name) == keys.end())
          throw std::runtime_error(fmt::format("unknown field \"{}\"", name));
      entries.push_back(parse(entry));
    } catch (const std::exception& error) {
      throw std::runtime_error(fmt::format("{}[{}]: {}", key, i, error.what()));
    }
  }
  return entries;
}

HostRef host_field(const nlohmann::json& object, const char* key) {
  if (!object.contains(key)) throw std::runtime_error(fmt::format("{}: missing", key));
  const auto text = field(object, key, std::string());
  try {
    return HostRef::parse(text);
  } catch (const std::invalid_argument& error) {
    throw std::runtime_error(fmt::format("{}: {}", key, error.what()));
  }
}

// Both hosts exist and the link is shaped: the marker drains at its rate.
void check_ecn_marking(const EcnMarkingSpec& marking, const Scenario& scenario) {
  const HostRef link = marking.link;
  if (link.role == HostRef::Role::Worker && link.index >= scenario.workers)
    throw std::runtime_error(fmt::format("link: {} workers (0..{})", scenario.workers, scenario.workers - 1));
  if (link.role == HostRef::Role::Aggregator && scenario.layout.colocated)
    throw std::runtime_error(fmt::format(
        "link: co-located aggregators have no link of their own (\"worker {}\" is the host's link)", link.index));
  if (link.role == HostRef::Role::Aggregator && link.index >= scenario.layout.aggregators)
    throw std::runtime_error(fmt::format("link: {} aggregators (0..{})", scenario.layout.aggregators,
                                         scenario.layout.aggregators - 1));
  if (link_gbit(scenario, link) <= 0)
    throw std::runtime_error(fmt::format("link: {}'s link is not shaped ({} is 0), and the marker drains at its rate",
                                         link.to_string(),
                                         link.role == HostRef::Role::Worker ? "worker_gbit" : "aggregator_gbit"));
  if (!(marking.threshold_kb > 0)) throw std::runtime_error("threshold_kb must be positive");
  if (!(marking.rate_fraction > 0 && marking.rate_fraction <= 1))
    throw std::runtime_error("rate_fraction must be in (0, 1]");
}

}  // namespace

std::string CompetingFlowSpec::label() const { return fmt::format("{} -> {}", from.to_string(), to.to_string()); }

void check_competing_flow(const CompetingFlowSpec& flow, uint32_t workers, const Layout& layout) {
  const uint32_t aggregators = layout.colocated ? workers : layout.aggregators;
  for (const HostRef& host : {flow.from, flow.to}) {
    const bool worker = host.role == HostRef::Role::Worker;
    if (const uint32_t count = worker ? workers : aggregators; host.index >= count)
      throw std::invalid_argument(fmt::format("{}: the testbed has {} {}s (0..{})", host.to_string(), count,
                                              worker ? "worker" : "aggregator", count - 1));
  }
  if (flow.from == flow.to) throw std::invalid_argument(fmt::format("from and to are both {}", flow.from.to_string()));
  if (!layout.colocated && flow.from.role == HostRef::Role::Aggregator && flow.to.role == HostRef::Role::Aggregator)
    throw std::invalid_argument("dedicated aggregators cannot reach one another (their bridge ports are isolated)");
  if (layout.colocated && flow.from.index == flow.to.index)
    throw std::invalid_argument(fmt::format("{} and {} share host {}: the flow would cross no link",
                                            flow.from.to_string(), flow.to.to_string(), flow.from.index));
}

void check_congestion_fields(const Scenario& scenario) {
  for (size_t i = 0; i < scenario.competing_flows.size(); ++i) try {
      check_competing_flow(scenario.competing_flows[i], scenario.workers, scenario.layout);
    } catch (const std::invalid_argument& error) {
      throw std::runtime_error(fmt::format("competing_flows[{}]: {}", i, error.what()));
    }
  for (size_t i = 0; i < scenario.ecn_marking.size(); ++i) {
    const HostRef link = scenario.ecn_marking[i].link;
    try {
      check_ecn_marking(scenario.ecn_marking[i], scenario);
    } catch (const std::runtime_error& error) {
      throw std::runtime_error(fmt::format("ecn_marking[{}]: {}", i, error.what()));
    }
    for (size_t k = 0; k < i; ++k)
      if (scenario.ecn_marking[k].link == link)
        throw std::runtime_error(
            fmt::format("ecn_marking[{}]: {} is already marked by entry {}", i, link.to_string(), k));
  }
}

double link_gbit(const Scenario& scenario, HostRef link) {
  const auto& rates = link.role == HostRef::Role::Worker || scenario.layout.colocated ? scenario.worker_gbit
                                                                                       : scenario.aggregator_gbit;
  return link.index < rates.size() ? rates[link.index] : 0;
}

Scenario load_scenario(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error(fmt::format("cannot read scenario {}", file.string()));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    throw std::runtime_error(fmt::format("scenario {}: not JSON: {}", file.string(), error.what()));
  }
  Scenario s;
  s.name = file.stem().string();
  auto fail = [&](const std::string& what) {
    throw std::runtime_error(fmt::format("scenario {} ({}): {}", s.name, file.string(), what));
  };
  if (!j.is_object()) fail("not a JSON object");
  // A misspelt field would otherwise leave its default in place unnoticed.
  for (const auto& [key, value] : j.items())
    if (std::ranges::find(kFields, key) == std::end(kFields)) fail(fmt::format("unknown field \"{}\"", key));
  try {
    s.name = field(j, "name", s.name);
    s.workers = field(j, "workers", s.workers);
    s.model = field(j, "model", s.model);
    s.gradient_scale = field(j, "gradient_scale", s.gradient_scale);
    s.bucket_mb = field(j, "bucket_mb", s.bucket_mb);
    s.compute_ms = field(j, "compute_ms", std::vector<double>(s.workers, 0.0));
    s.compute_jitter = field(j, "compute_jitter", 0.0);
    s.layout = layout_field(j);
    s.worker_gbit = field(j, "worker_gbit", std::vector<double>{});
    s.aggregator_gbit = aggregator_gbit_field(j, s.layout);
    if (s.layout.automatic) s.layout.aggregators = static_cast<uint32_t>(s.aggregator_gbit.size());
    s.loss = field(j, "loss", 0.0);
    s.competing_flows = object_array_field(j, "competing_flows", {"from", "to"}, [&](const nlohmann::json& entry) {
      return CompetingFlowSpec{host_field(entry, "from"), host_field(entry, "to")};
    });
    s.ecn_marking = object_array_field(
        j, "ecn_marking", {"link", "threshold_kb", "rate_fraction"}, [&](const nlohmann::json& entry) {
          if (!entry.contains("threshold_kb")) throw std::runtime_error("threshold_kb: missing");
          return EcnMarkingSpec{host_field(entry, "link"), field(entry, "threshold_kb", 0.0),
                                field(entry, "rate_fraction", 1.0)};
        });
    s.systems = field(j, "systems", s.systems);
    s.mtu = field(j, "mtu", s.mtu);
    s.wire_bits = field(j, "wire_bits", s.wire_bits);
  } catch (const std::runtime_error& error) {
    fail(error.what());
  }
  // Past one aggregator's 64 ranks only in two levels.
  const bool levels_possible = s.layout.two_level || s.layout.automatic;
  const uint32_t max_workers = levels_possible ? kMaxWorkers : XAGG_MAX_WORKERS;
  if (s.workers < 2 || s.workers > max_workers)
    fail(fmt::format("workers must be 2..{}{}", max_workers, levels_possible ? "" : " (two-level layouts: more)"));
  if (s.compute_ms.size() != s.workers) fail("compute_ms needs one entry per worker");
  if (std::ranges::any_of(s.compute_ms, [](double ms) { return ms < 0; })) fail("compute_ms must not be negative");
  if (s.compute_jitter < 0 || s.compute_jitter >= 1) fail("compute_jitter must be in [0, 1)");
  if (!s.worker_gbit.empty() && s.worker_gbit.size() != s.workers) fail("worker_gbit needs one entry per worker");
  if (std::ranges::any_of(s.worker_gbit, [](double gbit) { return gbit < 0; }))
    fail("worker_gbit must not be negative (0: not shaped)");
  if (std::ranges::any_of(s.aggregator_gbit, [](double gbit) { return gbit < 0; }))
    fail("aggregator_gbit must not be negative (0: not shaped)");
  if (s.gradient_scale <= 0 || s.gradient_scale > 1) fail("gradient_scale must be in (0, 1]");
  if (s.bucket_mb <= 0) fail("bucket_mb must be positive");
  if (s.mtu < kMinTestbedMtu || s.mtu > kMaxTestbedMtu)
    fail(fmt::format("mtu must be {}..{} (every link's)", kMinTestbedMtu, kMaxTestbedMtu));
  if (s.loss < 0 || s.loss >= 1) fail("loss must be in [0, 1)");
  if (s.systems.empty()) fail("systems is empty");
  if (s.wire_bits != 32 && s.wire_bits != 16) fail(fmt::format("wire_bits must be 32 or 16, not {}", s.wire_bits));
  try {
    check_congestion_fields(s);
  } catch (const std::runtime_error& error) {
    fail(error.what());
  }
  return s;
}

ScenarioNetwork::ScenarioNetwork(const Testbed& testbed, const Scenario& scenario)
    : shaping_(checked(testbed, scenario), {scenario.aggregator_gbit, scenario.worker_gbit}) {
  if (scenario.loss > 0) loss_.emplace(testbed, scenario.workers, scenario.loss);
  for (const EcnMarkingSpec& marking : scenario.ecn_marking)
    markings_.push_back(std::make_unique<LinkMarking>(testbed, marking.link, link_gbit(scenario, marking.link),
                                                      marking.threshold_kb, marking.rate_fraction));
  for (const CompetingFlowSpec& flow : scenario.competing_flows)
    flows_.push_back(
        std::make_unique<CompetingFlow>(testbed.host(flow.from), testbed.host(flow.to), flow.label()));
}

// Shaping another layout's links would leave the scenario's unshaped without a word.
const Testbed& ScenarioNetwork::checked(const Testbed& testbed, const Scenario& scenario) {
  if (testbed.layout() != scenario.layout)
    throw std::runtime_error(fmt::format("scenario {} needs aggregators {}, testbed {} is up with {}", scenario.name,
                                         scenario.layout.to_string(), testbed.prefix(),
                                         testbed.layout().to_string()));
  return testbed;
}

}  // namespace xagg::testbed
