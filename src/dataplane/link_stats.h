// The aggregator interface's own kernel counters (struct rtnl_link_stats64,
// what `ip -s -s link` shows): frames a driver or veth ring dropped before the
// XDP program saw them are counted only there, not in the data plane's counters.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace xagg::dataplane {

// (name, value) in a fixed order; the names are rtnl_link_stats64's fields
// ("rx_packets", "rx_dropped", "rx_missed_errors", ...).
using LinkCounters = std::vector<std::pair<const char*, uint64_t>>;

// Asks the kernel over rtnetlink (RTM_GETLINK, IFLA_STATS64) in the calling
// thread's network namespace. Throws std::runtime_error naming the interface.
LinkCounters read_link_counters(const std::string& interface);

}  // namespace xagg::dataplane
