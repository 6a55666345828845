// Moving the calling process into a named network namespace (ip netns).
#pragma once

#include <string>

namespace xagg {

// Enters /run/netns/<name>; throws std::runtime_error naming the namespace and the reason.
// Call before creating threads: setns() switches only the calling thread.
void enter_netns(const std::string& name);

}  // namespace xagg
