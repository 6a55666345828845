#include "capabilities.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace xagg {
namespace {

// The effective set as two 32-bit words (capabilities 0..63). glibc has no
// capget wrapper and libcap is not worth a dependency for one call.
std::array<uint32_t, 2> effective_set() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) != 0)
    throw std::runtime_error(fmt::format("reading the process's capabilities: {}", std::strerror(errno)));
  return {data[0].effective, data[1].effective};
}

std::vector<std::string> names(std::span<const Capability> capabilities) {
  std::vector<std::string> result;
  for (const Capability& capability : capabilities) result.emplace_back(capability.name);
  return result;
}

}  // namespace

std::vector<std::string> missing_capabilities(std::span<const Capability> required) {
  const std::array<uint32_t, 2> effective = effective_set();
  std::vector<std::string> missing;
  for (const Capability& capability : required) {
    const auto word = static_cast<size_t>(capability.number / 32);
    if (!(effective.at(word) & (1u << (capability.number % 32)))) missing.emplace_back(capability.name);
  }
  return missing;
}

void require_capabilities(std::span<const Capability> required, std::string_view who) {
  std::vector<std::string> missing = missing_capabilities(required);
  if (!missing.empty())
    throw std::runtime_error(fmt::format("{} needs {} (missing: {}); run as root or grant them", who,
                                         fmt::join(names(required), ", "), fmt::join(missing, ", ")));
}

}  // namespace xagg
