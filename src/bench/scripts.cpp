#include <string>

#include "bench.h"

namespace xagg::bench {

std::optional<std::filesystem::path> find_script(std::string_view name) {
  namespace fs = std::filesystem;
  const fs::path relative = fs::path("scripts") / name;
  for (auto dir = fs::read_symlink("/proc/self/exe").parent_path(); dir != dir.parent_path(); dir = dir.parent_path())
    if (fs::exists(dir / relative)) return dir / relative;
  // A build directory outside the source tree.
  if (fs::path built_from = fs::path(XAGG_SOURCE_DIR) / relative; fs::exists(built_from)) return built_from;
  if (fs::path installed = fs::path(XAGG_INSTALLED_SCRIPTS_DIR) / name; fs::exists(installed)) return installed;
  return std::nullopt;
}

}  // namespace xagg::bench
