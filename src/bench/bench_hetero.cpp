// Placeholder until the hetero benchmark lands.
#include "bench.h"

namespace xagg::bench {
void add_hetero_command(CLI::App& bench) { bench.add_subcommand("hetero", "(not built yet)"); }
}  // namespace xagg::bench
