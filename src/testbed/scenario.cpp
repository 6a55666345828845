#include "scenario.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace xagg::testbed {

namespace {

constexpr uint32_t kMaxWorkers = 64;  // the aggregator's rank bitmap
const char* const kFields[] = {"name",        "workers",  "model",          "gradient_scale", "bucket_mb", "compute_ms",
                               "compute_jitter", "worker_gbit", "aggregator_gbit", "loss",     "systems"};

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
    s.name = j.value("name", s.name);
    s.workers = j.value("workers", s.workers);
    s.model = j.value("model", s.model);
    s.gradient_scale = j.value("gradient_scale", s.gradient_scale);
    s.bucket_mb = j.value("bucket_mb", s.bucket_mb);
    s.compute_ms = j.value("compute_ms", std::vector<double>(s.workers, 0.0));
    s.compute_jitter = j.value("compute_jitter", 0.0);
    s.worker_gbit = j.value("worker_gbit", std::vector<double>{});
    s.aggregator_gbit = j.value("aggregator_gbit", 0.0);
    s.loss = j.value("loss", 0.0);
    s.systems = j.value("systems", s.systems);
  } catch (const nlohmann::json::exception& error) {
    fail(fmt::format("a field has the wrong type: {}", error.what()));
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
