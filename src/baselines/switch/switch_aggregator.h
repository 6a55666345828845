// The switch-style baseline's aggregator: loads bpf/xagg_switch.bpf.c on an
// interface and serves one job at a time through the XAgg control protocol
// (JSON lines, docs/protocol.md section 2): a worker joins, asking in
// `elements` for the slots the job uses, and gets the job's token, data port
// and result port, and in start's `chunks` its slot count. The job's workers choose its packet
// size (up to XSW_MAX_PACKET_ELEMS elements); the aggregator needs no setting
// for it.
#pragma once

#include <cstdint>
#include <string>

#include "xagg_switch_wire.h"

namespace xagg::baselines::switchml {

inline constexpr uint16_t kDefaultDataPort = 9989;
inline constexpr uint16_t kDefaultControlPort = 9990;
inline constexpr uint16_t kResultPort = 20100;

struct SwitchAggregatorOptions {
  std::string interface = "eth0";
  uint16_t data_port = kDefaultDataPort;
  uint16_t control_port = kDefaultControlPort;
  uint32_t slots = XSW_DEFAULT_SLOTS;  // pool size: the most slots a job may use, all of them if it asks none
  std::string broadcast = "198.18.255.255";
};

// Runs until SIGINT or SIGTERM, then detaches. Throws std::runtime_error when
// it cannot start. Call from a single-threaded process: it blocks those signals.
void run_switch_aggregator(const SwitchAggregatorOptions& options);

}  // namespace xagg::baselines::switchml
