// `xagg bench` sub-commands, each in its own file.
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cluster.h"

namespace xagg::bench {

void add_throughput_command(CLI::App& bench);  // bench_throughput.cpp
void add_hetero_command(CLI::App& bench);      // bench_hetero.cpp
void add_capacity_command(CLI::App& bench);    // bench_capacity.cpp

// scripts/<name> (the plotting scripts) from a directory above this binary,
// else from the source tree it was built from, else from `make install`'s
// scripts directory (scripts.cpp).
std::optional<std::filesystem::path> find_script(std::string_view name);

// A system a benchmark runs (systems.cpp): what serves its ranks (they use
// testbed::backend_of(kind)) and the bits per element they send.
struct BenchSystem {
  const char* name;
  testbed::AggregatorKind kind;
  uint32_t wire_bits = 32;  // 16: xagg's 16-bit wire, gloo's float16 (backends::BackendConfig::wire_bits)
};

// The one of `systems` with this name; throws std::invalid_argument naming the known ones.
const BenchSystem& system_named(std::span<const BenchSystem> systems, const std::string& name);
std::vector<std::string> system_names(std::span<const BenchSystem> systems);

// The systems a run takes at `wire_bits` bits per element (a bench's
// --wire-bits, a scenario's "wire_bits"): at 16, each of `names` that has a
// 16-bit variant in `systems` (its name and "16": xagg16, gloo16, xagg-xdp16)
// runs as that variant, the others (tcp-ps, the switch) as named; at 32, all
// as named. Throws std::invalid_argument for another width, an unknown name or
// a list that then names a system twice.
std::vector<std::string> systems_at_wire_bits(std::span<const BenchSystem> systems,
                                              const std::vector<std::string>& names, uint32_t wire_bits);

}  // namespace xagg::bench
