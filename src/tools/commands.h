// Sub-commands of the `xagg` tool; each lives in its own cmd_*.cpp.
#pragma once

#include <CLI/CLI.hpp>

namespace xagg::tools {

void add_aggregator_command(CLI::App& app);  // cmd_aggregator.cpp: run the daemon
void add_stats_command(CLI::App& app);       // cmd_stats.cpp: show data-plane counters
void add_testbed_command(CLI::App& app);     // cmd_testbed.cpp: namespaces up/down
void add_worker_command(CLI::App& app);      // cmd_worker.cpp: a verifying all-reduce worker
void add_demo_command(CLI::App& app);        // cmd_demo.cpp: the end-to-end demo
void add_tcp_ps_command(CLI::App& app);      // cmd_tcp_ps.cpp: the TCP parameter-server baseline
void add_bench_command(CLI::App& app);       // cmd_bench.cpp: benchmarks (src/bench)
void add_train_command(CLI::App& app);       // cmd_train.cpp: data-parallel training (src/train)
void add_doctor_command(CLI::App& app);      // cmd_doctor.cpp: check a host before it serves
void add_plan_command(CLI::App& app);        // cmd_plan.cpp: choose the aggregator layout from the links
// src/baselines/switch/switch_aggregator_command.cpp: the switch-style (SwitchML) baseline daemon
void add_switch_aggregator_command(CLI::App& app);

}  // namespace xagg::tools
