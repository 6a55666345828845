// Placeholder until the stats command lands.
#include "commands.h"

namespace xagg::tools {
void add_stats_command(CLI::App& app) { app.add_subcommand("stats", "(not built yet)"); }
}  // namespace xagg::tools
