// Placeholder until the worker command lands.
#include "commands.h"

namespace xagg::tools {
void add_worker_command(CLI::App& app) { app.add_subcommand("worker", "(not built yet)"); }
}  // namespace xagg::tools
