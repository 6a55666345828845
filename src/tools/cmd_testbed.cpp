// Placeholder until the testbed command lands.
#include "commands.h"

namespace xagg::tools {
void add_testbed_command(CLI::App& app) { app.add_subcommand("testbed", "(not built yet)"); }
}  // namespace xagg::tools
