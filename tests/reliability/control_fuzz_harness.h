// Drives the control plane without sockets: bytes become control lines and
// hang-ups of a few simulated connections, decoded with control::decode and
// handed to a JobRegistry over a recording Outbox and an in-memory Engine, the
// way the daemon dispatches them. Shared by the libFuzzer target and the
// CI-sized GoogleTest run.
//
// Input: lines separated by '\n'. A line's first byte picks the connection
// ((byte & 0x7f) % kConnections); a line of just that byte with the high bit
// set is a hang-up of that connection; the rest of the line is what the
// connection sent.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace xagg::reliability {

inline constexpr uint32_t kConnections = 6;
inline constexpr uint64_t kFuzzMemoryQuota = uint64_t{64} << 20;

struct ControlRun {
  // Invariants broken, empty when none: no exception escapes, every refused
  // line is answered with an error and closes its connection, the engine never
  // sees an impossible call (such as a rank registered twice in a job), used
  // memory stays within the quota, and once every connection is gone no job is left.
  std::vector<std::string> violations;
  // Every error line a connection received, in order, as "<connection>: <text>".
  std::vector<std::string> errors;
};

// Feeds one input to a fresh registry.
ControlRun run_control(std::string_view input);

// run_control's violations only.
std::vector<std::string> run_control_input(std::string_view input);

}  // namespace xagg::reliability
