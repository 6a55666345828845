// xagg: one binary for the aggregator daemon, the testbed and the tools.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <exception>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"XAgg: in-kernel (XDP) gradient aggregation"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  app.parse_complete_callback([&] { spdlog::set_level(spdlog::level::from_str(log_level)); });

  xagg::tools::add_aggregator_command(app);
  xagg::tools::add_stats_command(app);
  xagg::tools::add_testbed_command(app);
  xagg::tools::add_worker_command(app);
  xagg::tools::add_demo_command(app);
  xagg::tools::add_tcp_ps_command(app);
  xagg::tools::add_bench_command(app);
  xagg::tools::add_train_command(app);
  xagg::tools::add_doctor_command(app);
  xagg::tools::add_switch_aggregator_command(app);

  try {
    CLI11_PARSE(app, argc, argv);
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
    return 1;
  }
  return 0;
}
