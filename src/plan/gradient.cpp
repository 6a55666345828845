#include "gradient.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace xagg::plan {

namespace fs = std::filesystem;

fs::path trace_file(const fs::path& scenario_file, const std::string& model) {
  std::vector<fs::path> roots{fs::absolute(scenario_file).parent_path().parent_path()};
  for (auto dir = fs::read_symlink("/proc/self/exe").parent_path(); dir != dir.parent_path(); dir = dir.parent_path())
    roots.push_back(dir);
  for (const fs::path& root : roots)
    if (fs::exists(root / "traces" / (model + ".json"))) return root / "traces" / (model + ".json");
  throw std::runtime_error(fmt::format("no traces/{}.json (scripts/model_traces.py writes it)", model));
}

std::vector<uint64_t> backward_buckets(const fs::path& trace, double scale, double bucket_mb) {
  std::ifstream in(trace);
  nlohmann::json j = nlohmann::json::parse(in);
  const auto& tensors = j.at("tensors");
  const auto bucket_elements = static_cast<uint64_t>(bucket_mb * 1e6 / sizeof(float));
  std::vector<uint64_t> buckets{0};
  for (auto tensor = tensors.rbegin(); tensor != tensors.rend(); ++tensor) {
    auto elements = std::max<uint64_t>(1, static_cast<uint64_t>((*tensor).at("elements").get<double>() * scale));
    if (buckets.back() > 0 && buckets.back() + elements > bucket_elements) buckets.push_back(0);
    buckets.back() += elements;
  }
  return buckets;
}

}  // namespace xagg::plan
