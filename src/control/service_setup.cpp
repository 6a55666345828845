#include "service_setup.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/magic.h>
#include <pwd.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace xagg::control {
namespace {

bool bpffs_mounted() {
  struct statfs fs {};
  return statfs(kBpffsRoot, &fs) == 0 && fs.f_type == BPF_FS_MAGIC;
}

// With the effective ids and capabilities, as the kernel will check them.
bool may(const char* path, int access_mode) { return faccessat(AT_FDCWD, path, access_mode, AT_EACCESS) == 0; }

std::string describe_directory(const char* path) {
  struct stat info {};
  if (stat(path, &info) != 0) return fmt::format("{} ({})", path, std::strerror(errno));
  return fmt::format("{} (mode {:04o}, owner uid {})", path, info.st_mode & 07777, info.st_uid);
}

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(fmt::format("{}: {}", what, std::strerror(errno)));
}

// Creates `path` (if missing) as a 0700 directory of uid:gid.
void provide_directory(const char* path, uid_t uid, gid_t gid) {
  if (mkdir(path, 0700) != 0 && errno != EEXIST) fail(fmt::format("creating {}", path));
  if (chown(path, uid, gid) != 0) fail(fmt::format("chown of {}", path));
  if (chmod(path, 0700) != 0) fail(fmt::format("chmod of {}", path));
}

}  // namespace

std::optional<std::string> pin_root_problem() {
  if (!bpffs_mounted()) return std::nullopt;
  if (!may(kBpffsRoot, X_OK))
    return fmt::format("uid {} cannot enter {}: CAP_BPF does not bypass directory permissions, and systemd mounts "
                       "bpffs with mode 0700",
                       geteuid(), describe_directory(kBpffsRoot));
  if (access(kPinRoot, F_OK) == 0) {
    if (!may(kPinRoot, W_OK | X_OK))
      return fmt::format("uid {} cannot write {}", geteuid(), describe_directory(kPinRoot));
  } else if (!may(kBpffsRoot, W_OK)) {
    return fmt::format("{} does not exist and uid {} cannot create it in {}", kPinRoot, geteuid(),
                       describe_directory(kBpffsRoot));
  }
  return std::nullopt;
}

std::string prepare_command() {
  const passwd* user = getpwuid(geteuid());
  return fmt::format("as root, `xagg aggregator --prepare-for {}` (the xagg-aggregator unit runs it as ExecStartPre)",
                     user ? user->pw_name : std::to_string(geteuid()));
}

void prepare_for_user(const std::string& user_name) {
  errno = 0;
  const passwd* user = getpwnam(user_name.c_str());
  if (!user) throw std::runtime_error(fmt::format("--prepare-for: there is no user '{}'", user_name));
  if (!bpffs_mounted()) {
    if (mount("bpf", kBpffsRoot, "bpf", 0, "mode=0700") != 0) fail(fmt::format("mounting bpffs at {}", kBpffsRoot));
    spdlog::info("mounted bpffs at {}", kBpffsRoot);
  }
  // Search only: the names in it stay unlistable, and every pin and directory
  // in it keeps its own mode (libbpf pins are 0600).
  struct stat root {};
  if (stat(kBpffsRoot, &root) != 0) fail(fmt::format("stat of {}", kBpffsRoot));
  const mode_t searchable = (root.st_mode & 07777) | S_IXGRP | S_IXOTH;
  if ((root.st_mode & 07777) != searchable) {
    if (chmod(kBpffsRoot, searchable) != 0) fail(fmt::format("chmod go+x of {}", kBpffsRoot));
    spdlog::info("{}: added search permission for other users (mode {:04o})", kBpffsRoot, searchable);
  }
  provide_directory(kPinRoot, user->pw_uid, user->pw_gid);
  provide_directory(kRunDirectory, user->pw_uid, user->pw_gid);
  // What a daemon run as root left there (a crashed one's pins, its lock
  // files) becomes the user's too, so that the daemon can remove it.
  for (const char* root : {kPinRoot, kRunDirectory})
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root))
      if (lchown(entry.path().c_str(), user->pw_uid, user->pw_gid) != 0)
        fail(fmt::format("chown of {}", entry.path().string()));
  spdlog::info("{} and {} are {}'s (mode 0700)", kPinRoot, kRunDirectory, user_name);
}

}  // namespace xagg::control
