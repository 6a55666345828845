// The aggregator daemon: starts an aggregation engine on an interface (the
// XDP data plane, or the user-space UDP baseline) and runs the TCP control
// endpoint workers join jobs through.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "dataplane.h"
#include "wire.h"

namespace xagg::control {

enum class EngineKind { Xdp, Userspace };

struct DaemonOptions {
  std::string interface;
  EngineKind engine = EngineKind::Xdp;
  unsigned userspace_threads = 0;  // user-space engine: 0 = one per CPU
  dataplane::AttachMode mode = dataplane::AttachMode::Native;
  uint16_t data_port = wire::kDefaultDataPort;
  bool result_fan_out = true;  // XDP engine: dataplane::LoadOptions::result_fan_out
  uint16_t control_port = wire::kDefaultControlPort;
  uint16_t result_port_base = 20000;
  uint64_t memory_quota = uint64_t{4} << 30;  // bytes of aggregation cells over all jobs
  std::optional<in_addr> broadcast;           // default: the interface's directed broadcast
  // RegistrySettings::results: nullopt (auto) picks broadcast or unicast per job.
  std::optional<wire::ResultMode> results;
  std::optional<in_addr> multicast_base;  // required by results Multicast
  std::optional<in_addr> metrics_address;     // where /metrics is served; none: not served
  uint16_t metrics_port = 9989;
  std::string secret;  // cluster secret a join must prove (admission.h); empty: none
  // A leaf job's parent aggregator is dead after this long without an answer
  // to heartbeats (or once it closes the connection); the leaf job is aborted.
  std::chrono::milliseconds parent_dead_after{2000};
};

// Runs until SIGINT or SIGTERM, then detaches and frees everything. Throws
// std::runtime_error when it cannot start (not root, no such interface, ...).
// Call from a single-threaded process: it blocks those signals to read them.
void run_aggregator(const DaemonOptions& options);

}  // namespace xagg::control
