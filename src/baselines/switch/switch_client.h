// Worker side of the switch-style baseline: SwitchML's client protocol over
// the slot pool of bpf/xagg_switch.bpf.c. Block fixed-point quantization is
// the XAgg one (include/xagg/quantize.h), with one exponent per packet-sized
// block agreed on by a MAX pass through the same pool.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "xagg/communicator.h"
#include "xagg_switch_wire.h"

namespace xagg::baselines::switchml {

// How a job uses the pool: elements per packet (also the quantization block,
// 1 to XSW_MAX_PACKET_ELEMS) and slots, i.e. packets in flight per worker.
struct PoolShape {
  uint32_t packet_elems = XSW_DEFAULT_PACKET_ELEMS;
  uint32_t slots = XSW_DEFAULT_SLOTS;
};

// The backends (src/backends) this baseline provides. "switch": SwitchML's
// defaults. "switch-jumbo": XAgg's packet size with the same bytes in flight
// (2048 elements x 32 slots = 256 x 256 = 256 KB), so that the two together
// separate the cost of lock-step from the cost of small packets.
struct SwitchVariant {
  std::string_view name;
  PoolShape pool;
};
inline constexpr std::array<SwitchVariant, 2> kSwitchVariants{{
    {"switch", {}},
    {"switch-jumbo", {XSW_MAX_PACKET_ELEMS, XSW_DEFAULT_SLOTS * XSW_DEFAULT_PACKET_ELEMS / XSW_MAX_PACKET_ELEMS}},
}};

// The pool shape of a backend of kSwitchVariants; nullopt for any other name.
constexpr std::optional<PoolShape> switch_pool_shape(std::string_view backend) {
  for (const SwitchVariant& known : kSwitchVariants)
    if (known.name == backend) return known.pool;
  return std::nullopt;
}

struct SwitchClientConfig {
  std::string server;  // the switch aggregator's IPv4 address
  uint16_t control_port = 0;  // 0: kDefaultControlPort
  uint32_t job_id = 1;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  PoolShape pool;  // the same on every rank
  std::chrono::milliseconds join_timeout{30000};
  std::chrono::milliseconds operation_timeout{60000};
  // Outstanding shadow copies are sent again after this long without any
  // result; short enough to recover a loss, long enough that a slow round of
  // 256 KB in flight on two shared cores does not trigger a retransmission storm.
  std::chrono::milliseconds retransmit_timeout{50};
};

class SwitchClient {
 public:
  // Joins and waits until every rank joined. Throws ConfigError, CommError, TimeoutError.
  explicit SwitchClient(const SwitchClientConfig& config);
  ~SwitchClient();  // sends leave
  SwitchClient(const SwitchClient&) = delete;
  SwitchClient& operator=(const SwitchClient&) = delete;

  void allreduce(float* data, size_t count, ReduceOp op);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace xagg::baselines::switchml
