// Placeholder until the demo command lands.
#include "commands.h"

namespace xagg::tools {
void add_demo_command(CLI::App& app) { app.add_subcommand("demo", "(not built yet)"); }
}  // namespace xagg::tools
