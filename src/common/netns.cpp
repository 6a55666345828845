#include "netns.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace xagg {

void enter_netns(const std::string& name) {
  std::string path = "/run/netns/" + name;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw std::runtime_error(fmt::format("network namespace '{}': {} ({})", name, std::strerror(errno), path));
  int rc = setns(fd, CLONE_NEWNET);
  int err = errno;
  close(fd);
  if (rc != 0)
    throw std::runtime_error(fmt::format("cannot enter network namespace '{}': {}", name, std::strerror(err)));
}

}  // namespace xagg
