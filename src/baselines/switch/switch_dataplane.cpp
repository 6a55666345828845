#include "switch_dataplane.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fmt/format.h>
#include <linux/if_link.h>
#include <net/if.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "xagg_switch.skel.h"

namespace xagg::baselines::switchml {
namespace {

[[noreturn]] void fail(const std::string& what, int error = errno) {
  throw std::runtime_error(fmt::format("{}: {}", what, std::strerror(error)));
}

void check(int rc, const std::string& what) {
  if (rc < 0) fail(what, -rc);
}

}  // namespace

SwitchDataplane::SwitchDataplane(uint16_t data_port, uint32_t slots) : slots_(slots) {
  skeleton_ = xagg_switch_bpf__open();
  if (!skeleton_) fail("opening the switch XDP program");
  skeleton_->rodata->xsw_udp_port = data_port;
  try {
    check(bpf_map__set_max_entries(skeleton_->maps.xsw_slots, 2 * slots_), "sizing the slot pool");
    check(xagg_switch_bpf__load(skeleton_), "loading the switch XDP program");
  } catch (...) {
    xagg_switch_bpf__destroy(skeleton_);
    throw;
  }
}

SwitchDataplane::~SwitchDataplane() {
  if (ifindex_ != 0) bpf_xdp_detach(ifindex_, XDP_FLAGS_DRV_MODE, nullptr);
  xagg_switch_bpf__destroy(skeleton_);
}

void SwitchDataplane::attach(const std::string& interface) {
  int ifindex = static_cast<int>(if_nametoindex(interface.c_str()));
  if (ifindex == 0) fail(fmt::format("interface '{}'", interface));
  check(bpf_xdp_attach(ifindex, program_fd(), XDP_FLAGS_DRV_MODE, nullptr), "attaching XDP to " + interface);
  ifindex_ = ifindex;
}

int SwitchDataplane::program_fd() const { return bpf_program__fd(skeleton_->progs.xagg_switch); }

void SwitchDataplane::start_job(const xsw_config& config, const std::map<uint32_t, xsw_worker>& workers) {
  if (config.slots == 0 || config.slots > slots_)
    throw std::invalid_argument(fmt::format("a job of {} slots in a pool of {}", config.slots, slots_));
  set_config({});  // drop DATA while the pool is reset
  std::vector<uint32_t> keys(2 * config.slots);
  std::vector<xsw_slot> empty(keys.size());
  for (uint32_t i = 0; i < keys.size(); ++i) keys[i] = i;
  uint32_t count = static_cast<uint32_t>(keys.size());
  check(bpf_map_update_batch(bpf_map__fd(skeleton_->maps.xsw_slots), keys.data(), empty.data(), &count, nullptr),
        "clearing the slot pool");
  for (uint32_t rank = 0; rank < XSW_MAX_WORKERS; ++rank) {
    auto found = workers.find(rank);
    xsw_worker entry = found == workers.end() ? xsw_worker{} : found->second;
    check(bpf_map_update_elem(bpf_map__fd(skeleton_->maps.xsw_workers), &rank, &entry, BPF_ANY),
          "registering workers");
  }
  xsw_config active = config;
  active.active = 1;
  set_config(active);
}

void SwitchDataplane::stop_job() { set_config({}); }

std::vector<uint64_t> SwitchDataplane::counters() const {
  int cpus = libbpf_num_possible_cpus();
  std::vector<uint64_t> totals(XSW_CNT_COUNT), per_cpu(cpus);
  for (uint32_t key = 0; key < XSW_CNT_COUNT; ++key) {
    if (bpf_map_lookup_elem(bpf_map__fd(skeleton_->maps.xsw_counters), &key, per_cpu.data()) != 0) continue;
    for (uint64_t value : per_cpu) totals[key] += value;
  }
  return totals;
}

void SwitchDataplane::set_config(const xsw_config& config) {
  uint32_t zero = 0;
  check(bpf_map_update_elem(bpf_map__fd(skeleton_->maps.xsw_config_map), &zero, &config, BPF_ANY),
        "writing the job configuration");
}

}  // namespace xagg::baselines::switchml
