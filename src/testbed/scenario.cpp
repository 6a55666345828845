#include "scenario.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace xagg::testbed {

Scenario load_scenario(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error(fmt::format("cannot read scenario {}", file.string()));
  nlohmann::json j = nlohmann::json::parse(in);
  Scenario s;
  s.name = j.value("name", file.stem().string());
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
  if (s.workers < 2 || s.compute_ms.size() != s.workers || (!s.worker_gbit.empty() && s.worker_gbit.size() != s.workers))
    throw std::runtime_error(fmt::format("scenario {}: compute_ms and worker_gbit need one entry per worker", s.name));
  if (s.gradient_scale <= 0 || s.gradient_scale > 1 || s.bucket_mb <= 0 || s.loss < 0 || s.loss >= 1)
    throw std::runtime_error(fmt::format("scenario {}: gradient_scale, bucket_mb or loss out of range", s.name));
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
