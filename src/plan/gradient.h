// A model's gradient as data-parallel training all-reduces it: the buckets
// backward produces, from the per-tensor traces in traces/*.json. The bench
// sends them; the planner times them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace xagg::plan {

// traces/<model>.json beside the scenario directory or in the source tree of this binary.
std::filesystem::path trace_file(const std::filesystem::path& scenario_file, const std::string& model);

// Gradient buckets (elements) in the order backward produces them: tensors
// reversed, each scaled by `scale`, packed into buckets of about bucket_mb
// (a bigger tensor is a bucket alone).
std::vector<uint64_t> backward_buckets(const std::filesystem::path& trace, double scale, double bucket_mb);

}  // namespace xagg::plan
