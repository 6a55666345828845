#include "output_file.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace xagg {

std::ofstream open_output(const std::filesystem::path& path) {
  std::ofstream file(path);
  if (!file) throw std::runtime_error(fmt::format("cannot write {}: {}", path.string(), std::strerror(errno)));
  return file;
}

void close_output(std::ofstream& file, const std::filesystem::path& path) {
  file.close();
  if (!file) throw std::runtime_error(fmt::format("cannot write {}", path.string()));
}

}  // namespace xagg
