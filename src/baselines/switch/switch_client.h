// Worker side of the switch-style baseline: SwitchML's client protocol over
// the slot pool of bpf/xagg_switch.bpf.c. Block fixed-point quantization is
// the XAgg one (include/xagg/quantize.h), with one exponent per 256-element
// packet agreed on by a MAX pass through the same pool.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "xagg/communicator.h"

namespace xagg::baselines::switchml {

struct SwitchClientConfig {
  std::string server;  // the switch aggregator's IPv4 address
  uint16_t control_port = 0;  // 0: kDefaultControlPort
  uint32_t job_id = 1;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  std::chrono::milliseconds join_timeout{30000};
  std::chrono::milliseconds operation_timeout{60000};
  // Outstanding shadow copies are sent again after this long without any
  // result; short enough to recover a loss, long enough that a slow round of
  // 256 slots on two shared cores does not trigger a retransmission storm.
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
