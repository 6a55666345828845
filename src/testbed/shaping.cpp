#include "shaping.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace xagg::testbed {

// tbf needs a bucket of at least one timer tick of traffic at the rate
// (4 ms at HZ=250) or it undershoots; never below a few jumbo frames.
uint64_t burst_bytes(double gbit) { return std::max<uint64_t>(64 * 1024, static_cast<uint64_t>(gbit * 1e9 / 8 * 0.004)); }

namespace {
constexpr std::chrono::milliseconds kQueueLatency{50};
}  // namespace

uint64_t queue_limit_bytes(double gbit) {
  return burst_bytes(gbit) + static_cast<uint64_t>(gbit * 1e9 / 8 * std::chrono::duration<double>(kQueueLatency).count());
}

std::string ingress_device(const std::string& interface) { return "ifb-" + interface; }

LinkDevices shaped_devices(const Testbed& testbed, HostRef host) {
  const HostLink link = testbed.link_of(host);
  const ShapedDevice to_host{link.bridge_netns, link.bridge_port};
  if (host.role == HostRef::Role::Aggregator && !testbed.layout().colocated)
    return {{link.bridge_netns, ingress_device(link.bridge_port)}, to_host};
  return {{link.netns, link.interface}, to_host};
}

Shaping::Shaping(const Testbed& testbed, const LinkRates& rates) {
  const Layout layout = testbed.layout();
  const uint32_t dedicated_aggregators = layout.colocated ? 0 : layout.aggregators;
  if (rates.aggregator_gbit.size() > dedicated_aggregators)
    throw std::invalid_argument(fmt::format("{} aggregator link rates for a testbed with {} dedicated aggregators",
                                            rates.aggregator_gbit.size(), dedicated_aggregators));
  try {
    for (uint32_t index = 0; index < rates.aggregator_gbit.size(); ++index) {
      if (rates.aggregator_gbit[index] <= 0) continue;
      HostLink aggregator = testbed.aggregator(index);
      shape(shaped_devices(testbed, {HostRef::Role::Aggregator, index}).to_host, rates.aggregator_gbit[index]);
      shape_ingress(aggregator.bridge_netns, aggregator.bridge_port, rates.aggregator_gbit[index]);
    }
    for (uint32_t index = 0; index < rates.worker_gbit.size(); ++index) {
      if (rates.worker_gbit[index] <= 0) continue;
      const LinkDevices devices = shaped_devices(testbed, {HostRef::Role::Worker, index});
      shape(devices.from_host, rates.worker_gbit[index]);
      shape(devices.to_host, rates.worker_gbit[index]);
    }
  } catch (...) {
    remove_all();  // no destructor runs for a constructor that throws
    throw;
  }
}

Shaping::~Shaping() { remove_all(); }

void Shaping::remove_all() {
  for (const ShapedInterface& link : shaped_)
    try_command({"ip", "netns", "exec", link.netns, "tc", "qdisc", "del", "dev", link.interface, "root"});
  shaped_.clear();
  for (const ShapedInterface& link : shaped_ingress_) {
    if (link.created_clsact)
      try_command({"ip", "netns", "exec", link.netns, "tc", "qdisc", "del", "dev", link.interface, "clsact"});
    else
      try_command({"ip", "netns", "exec", link.netns, "tc", "filter", "del", "dev", link.interface, "ingress", "prio",
                   std::to_string(kRedirectPriority)});
    try_command({"ip", "-n", link.netns, "link", "del", ingress_device(link.interface)});
  }
  shaped_ingress_.clear();
}

// Redirects everything arriving on the interface to an ifb device, whose tbf
// then releases it into the interface's receive path. The clsact qdisc may be
// shared with a loss filter (testbed::LinkLoss), which runs first.
void Shaping::shape_ingress(const std::string& netns, const std::string& interface, double gbit) {
  const std::string device = ingress_device(interface);
  run_command({"ip", "-n", netns, "link", "add", device, "type", "ifb"});
  ShapedInterface& link = shaped_ingress_.emplace_back(ShapedInterface{netns, interface});
  run_command({"ip", "-n", netns, "link", "set", device, "up"});
  if (run_command({"ip", "netns", "exec", netns, "tc", "qdisc", "show", "dev", interface}).find("clsact") ==
      std::string::npos) {
    run_command({"ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", interface, "clsact"});
    link.created_clsact = true;
  }
  run_command({"ip", "netns", "exec", netns, "tc", "filter", "add", "dev", interface, "ingress", "prio",
               std::to_string(kRedirectPriority), "protocol", "all", "u32", "match", "u32", "0", "0", "action",
               "mirred", "egress", "redirect", "dev", device});
  shape({netns, device}, gbit);
}

void Shaping::shape(const ShapedDevice& device, double gbit) {
  run_command({"ip", "netns", "exec", device.netns, "tc", "qdisc", "replace", "dev", device.device, "root", "tbf",
               "rate", fmt::format("{}kbit", static_cast<uint64_t>(gbit * 1e6)), "burst",
               std::to_string(burst_bytes(gbit)), "latency", fmt::format("{}ms", kQueueLatency.count())});
  shaped_.push_back({device.netns, device.device});
}

}  // namespace xagg::testbed
