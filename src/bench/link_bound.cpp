#include "link_bound.h"

#include <fmt/format.h>

#include <algorithm>

#include "shaping.h"

namespace xagg::bench {
namespace {

double rate_at(const std::vector<double>& rates, size_t index) { return index < rates.size() ? rates[index] : 0; }

}  // namespace

std::vector<LinkDemand> link_demands(const testbed::Layout& layout, const std::vector<double>& worker_gbit,
                                     const std::vector<double>& aggregator_gbit, Aggregation aggregation,
                                     double gradient_bytes) {
  const double g = gradient_bytes;
  const double n = static_cast<double>(worker_gbit.size());
  std::vector<LinkDemand> links;
  if (layout.colocated) {
    // Host i receives the other hosts' shares of its shard and their shards'
    // results: 2(N-1)/N G, a ring's bytes too. The results, and the last
    // rank's share of this shard, depend on every rank.
    for (size_t i = 0; i < worker_gbit.size(); ++i)
      links.push_back({fmt::format("host {}", i), worker_gbit[i], 2 * (n - 1) / n * g, g});
    return links;
  }
  for (size_t i = 0; i < worker_gbit.size(); ++i) {
    // Through aggregators a worker sends its gradient and receives the
    // result; a ring's links carry 2(N-1)/N G each (the least any all-reduce
    // among the workers alone can, Patarasuk and Yuan 2009).
    double total = aggregation == Aggregation::InAggregators ? g : 2 * (n - 1) / n * g;
    links.push_back({fmt::format("worker {}", i), worker_gbit[i], total, g});
  }
  if (aggregation == Aggregation::InAggregators) {
    // Aggregator k takes every worker's share of its shard, 1/K of the gradient
    // each, and sends its shard's result once (a broadcast).
    const double k = layout.aggregators;
    for (uint32_t index = 0; index < layout.aggregators; ++index)
      links.push_back({fmt::format("aggregator {}", index), rate_at(aggregator_gbit, index), n * g / k, g / k});
  }
  return links;
}

double link_seconds(const std::vector<LinkDemand>& links) {
  double seconds = 0;
  for (const LinkDemand& link : links)
    if (link.gbit > 0) seconds = std::max(seconds, link.total_bytes * 8 / (link.gbit * 1e9));
  return seconds;
}

double link_bound_ms(const std::vector<LinkDemand>& links, double any_first_ready_us, double every_first_ready_us,
                     double last_ready_us) {
  double last_result_us = 0;
  for (const LinkDemand& link : links) {
    if (link.gbit <= 0) continue;
    const double burst = static_cast<double>(testbed::burst_bytes(link.gbit));
    const double bytes_per_us = link.gbit * 1e3 / 8;
    last_result_us = std::max({last_result_us,
                               any_first_ready_us + std::max(0.0, link.total_bytes - burst) / bytes_per_us,
                               every_first_ready_us + std::max(0.0, link.dependent_bytes - burst) / bytes_per_us});
  }
  return std::max(0.0, (last_result_us - last_ready_us) / 1e3);
}

}  // namespace xagg::bench
