#include "shaping.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace xagg::testbed {

// tbf needs a bucket of at least one timer tick of traffic at the rate
// (4 ms at HZ=250) or it undershoots; never below a few jumbo frames.
uint64_t burst_bytes(double gbit) { return std::max<uint64_t>(64 * 1024, static_cast<uint64_t>(gbit * 1e9 / 8 * 0.004)); }

Shaping::Shaping(const Testbed& testbed, const LinkRates& rates) {
  try {
    if (rates.aggregator_gbit > 0) {
      shape(testbed.aggregator().netns, kHostInterface, rates.aggregator_gbit);
      shape(testbed.switch_netns(), testbed.aggregator().bridge_port, rates.aggregator_gbit);
    }
    for (uint32_t index = 0; index < rates.worker_gbit.size(); ++index) {
      if (rates.worker_gbit[index] <= 0) continue;
      HostLink worker = testbed.worker(index);
      shape(worker.netns, kHostInterface, rates.worker_gbit[index]);
      shape(testbed.switch_netns(), worker.bridge_port, rates.worker_gbit[index]);
    }
  } catch (...) {
    remove_all();  // no destructor runs for a constructor that throws
    throw;
  }
}

Shaping::~Shaping() { remove_all(); }

void Shaping::remove_all() {
  for (const ShapedInterface& link : shaped_) {
    try {
      run_command({"ip", "netns", "exec", link.netns, "tc", "qdisc", "del", "dev", link.interface, "root"});
    } catch (const CommandError& error) {
      spdlog::debug("removing the shaping of {}/{}: {}", link.netns, link.interface, error.what());
    }
  }
  shaped_.clear();
}

void Shaping::shape(const std::string& netns, const std::string& interface, double gbit) {
  run_command({"ip", "netns", "exec", netns, "tc", "qdisc", "replace", "dev", interface, "root", "tbf", "rate",
               fmt::format("{}kbit", static_cast<uint64_t>(gbit * 1e6)), "burst", std::to_string(burst_bytes(gbit)),
               "latency", "50ms"});
  shaped_.push_back({netns, interface});
}

}  // namespace xagg::testbed
