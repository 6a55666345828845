// `xagg bench` sub-commands, each in its own file.
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <optional>
#include <string_view>

namespace xagg::bench {

void add_throughput_command(CLI::App& bench);  // bench_throughput.cpp
void add_hetero_command(CLI::App& bench);      // bench_hetero.cpp
void add_capacity_command(CLI::App& bench);    // bench_capacity.cpp

// scripts/<name> (the plotting scripts) from a directory above this binary,
// else from the source tree it was built from, else from `make install`'s
// scripts directory (scripts.cpp).
std::optional<std::filesystem::path> find_script(std::string_view name);

}  // namespace xagg::bench
