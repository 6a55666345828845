// Drives the control plane without sockets: bytes become control lines and
// hang-ups of a few simulated connections, decoded with control::decode and
// handed to a JobRegistry over a recording Outbox and an in-memory Engine, the
// way the daemon dispatches them. Shared by the libFuzzer target and the
// CI-sized GoogleTest run.
//
// Input: lines separated by '\n'. A line's first byte picks the connection
// (byte % kConnections); a line of just that byte with the high bit set is a
// hang-up; the rest of the line is what the connection sent.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace xagg::reliability {

inline constexpr uint32_t kConnections = 6;
inline constexpr uint64_t kFuzzMemoryQuota = uint64_t{64} << 20;

// Feeds one input and returns the invariant violations found, empty when none:
// no exception escapes, every refused line is answered with an error and
// closes its connection, the engine never sees an impossible call, used memory
// stays within the quota, and once every connection is gone no job is left.
std::vector<std::string> run_control_input(std::string_view input);

}  // namespace xagg::reliability
