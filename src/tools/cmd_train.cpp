// Placeholder until the training command lands.
#include "commands.h"

namespace xagg::tools {
void add_train_command(CLI::App& app) { app.add_subcommand("train", "(not built yet)"); }
}  // namespace xagg::tools
