// `xagg bench`: groups the benchmarks of src/bench.
#include "bench.h"
#include "commands.h"

namespace xagg::tools {

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks: XAgg beside the baselines, in the testbed");
  bench->require_subcommand(1);
  xagg::bench::add_throughput_command(*bench);
  xagg::bench::add_hetero_command(*bench);
  xagg::bench::add_capacity_command(*bench);
}

}  // namespace xagg::tools
