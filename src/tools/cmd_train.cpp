// `xagg train ARGS` runs `xagg-train ARGS` (src/train), a separate executable
// next to this one: only it links libtorch, which keeps `xagg` quick to build
// and free of the torch dependency.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"

namespace xagg::tools {

void add_train_command(CLI::App& app) {
  auto* command = app.add_subcommand("train", "Data-parallel training on Fashion-MNIST (xagg train --help)");
  command->prefix_command();  // every argument, --help too, belongs to xagg-train
  command->set_help_flag();
  command->callback([command] {
    std::string trainer = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "xagg-train";
    std::vector<std::string> arguments = command->remaining();
    std::vector<char*> argv = {trainer.data()};
    for (auto& argument : arguments) argv.push_back(argument.data());
    argv.push_back(nullptr);
    execv(trainer.c_str(), argv.data());
    throw std::runtime_error(trainer + ": " + std::strerror(errno) + " (build the xagg-train target)");
  });
}

}  // namespace xagg::tools
