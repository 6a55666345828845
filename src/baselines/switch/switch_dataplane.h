// The switch-style baseline's data plane: bpf/xagg_switch.bpf.c loaded with
// its maps, attached to an interface by the aggregator daemon, or only loaded
// (tests run it through BPF_PROG_TEST_RUN).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "xagg_switch_wire.h"

struct xagg_switch_bpf;

namespace xagg::baselines::switchml {

class SwitchDataplane {
 public:
  // Loads the program for DATA on UDP port data_port and a pool of `slots`
  // slots (the most a job may use), each holding up to XSW_MAX_PACKET_ELEMS
  // elements. Throws std::runtime_error.
  SwitchDataplane(uint16_t data_port, uint32_t slots);
  ~SwitchDataplane();  // detaches
  SwitchDataplane(const SwitchDataplane&) = delete;
  SwitchDataplane& operator=(const SwitchDataplane&) = delete;

  void attach(const std::string& interface);
  int program_fd() const;

  // Empties the job's config.slots slots (at most the pool's) and the worker
  // table, then activates the job.
  void start_job(const xsw_config& config, const std::map<uint32_t, xsw_worker>& workers);
  void stop_job();

  // Sums of the per-CPU counters, in enum xsw_counter order.
  std::vector<uint64_t> counters() const;

 private:
  void set_config(const xsw_config& config);

  uint32_t slots_;
  xagg_switch_bpf* skeleton_ = nullptr;
  int ifindex_ = 0;  // 0: not attached
};

}  // namespace xagg::baselines::switchml
