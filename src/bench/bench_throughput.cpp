// Placeholder until the throughput benchmark lands.
#include "bench.h"

namespace xagg::bench {
void add_throughput_command(CLI::App& bench) { bench.add_subcommand("throughput", "(not built yet)"); }
}  // namespace xagg::bench
