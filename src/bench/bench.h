// `xagg bench` sub-commands, each in its own file.
#pragma once

#include <CLI/CLI.hpp>

namespace xagg::bench {

void add_throughput_command(CLI::App& bench);  // bench_throughput.cpp
void add_hetero_command(CLI::App& bench);      // bench_hetero.cpp
void add_capacity_command(CLI::App& bench);    // bench_capacity.cpp

}  // namespace xagg::bench
