// Placeholder until the aggregator command lands.
#include "commands.h"

namespace xagg::tools {
void add_aggregator_command(CLI::App& app) { app.add_subcommand("aggregator", "(not built yet)"); }
}  // namespace xagg::tools
