// xagg: one binary for the aggregator daemon, the testbed and the tools.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <exception>

#include "commands.h"
#include "log_format.h"

int main(int argc, char** argv) {
  CLI::App app{"XAgg: in-kernel (XDP) gradient aggregation"};
  app.require_subcommand(1);
  xagg::tools::add_logging_options(app);

  xagg::tools::add_aggregator_command(app);
  xagg::tools::add_stats_command(app);
  xagg::tools::add_testbed_command(app);
  xagg::tools::add_worker_command(app);
  xagg::tools::add_demo_command(app);
  xagg::tools::add_tcp_ps_command(app);
  xagg::tools::add_bench_command(app);
  xagg::tools::add_train_command(app);
  xagg::tools::add_doctor_command(app);
  xagg::tools::add_plan_command(app);
  xagg::tools::add_switch_aggregator_command(app);

  try {
    CLI11_PARSE(app, argc, argv);
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
    return 1;
  }
  return 0;
}
