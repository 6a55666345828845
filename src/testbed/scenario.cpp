#include "scenario.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <type_traits>

namespace xagg::testbed {

namespace {

constexpr uint32_t kMaxWorkers = 64;  // the aggregator's rank bitmap
const char* const kFields[] = {"name",        "workers",  "model",          "gradient_scale", "bucket_mb", "compute_ms",
                               "compute_jitter", "worker_gbit", "aggregator_gbit", "loss",     "systems"};

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

}  // namespace

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
    s.worker_gbit = field(j, "worker_gbit", std::vector<double>{});
    s.aggregator_gbit = field(j, "aggregator_gbit", 0.0);
    s.loss = field(j, "loss", 0.0);
    s.systems = field(j, "systems", s.systems);
  } catch (const std::runtime_error& error) {
    fail(error.what());
  }
  if (s.workers < 2 || s.workers > kMaxWorkers) fail(fmt::format("workers must be 2..{}", kMaxWorkers));
  if (s.compute_ms.size() != s.workers) fail("compute_ms needs one entry per worker");
  if (std::ranges::any_of(s.compute_ms, [](double ms) { return ms < 0; })) fail("compute_ms must not be negative");
  if (s.compute_jitter < 0 || s.compute_jitter >= 1) fail("compute_jitter must be in [0, 1)");
  if (!s.worker_gbit.empty() && s.worker_gbit.size() != s.workers) fail("worker_gbit needs one entry per worker");
  if (std::ranges::any_of(s.worker_gbit, [](double gbit) { return gbit < 0; }))
    fail("worker_gbit must not be negative (0: not shaped)");
  if (s.aggregator_gbit < 0) fail("aggregator_gbit must not be negative (0: not shaped)");
  if (s.gradient_scale <= 0 || s.gradient_scale > 1) fail("gradient_scale must be in (0, 1]");
  if (s.bucket_mb <= 0) fail("bucket_mb must be positive");
  if (s.loss < 0 || s.loss >= 1) fail("loss must be in [0, 1)");
  if (s.systems.empty()) fail("systems is empty");
  return s;
}

ScenarioNetwork::ScenarioNetwork(const Testbed& testbed, const Scenario& scenario)
    : shaping_(testbed, {scenario.aggregator_gbit, scenario.worker_gbit}) {
  if (scenario.loss > 0) loss_.emplace(testbed, scenario.workers, scenario.loss);
}

std::optional<LossCounters> ScenarioNetwork::loss_counters() const {
  if (!loss_) return std::nullopt;
  return loss_->counters();
}

}  // namespace xagg::testbed
