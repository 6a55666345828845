// The Linux capabilities a privileged command needs, checked up front so that
// it refuses to start with a message naming what is missing (not a bare EPERM
// from the first system call that needs one).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xagg {

struct Capability {
  int number;        // CAP_* from <linux/capability.h>
  const char* name;  // "CAP_BPF"
};

// Those of `required` missing from the calling thread's effective set.
std::vector<std::string> missing_capabilities(std::span<const Capability> required);

// Throws std::runtime_error naming `who` and every missing capability.
void require_capabilities(std::span<const Capability> required, std::string_view who);

}  // namespace xagg
