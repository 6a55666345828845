#include "link_bound.h"

#include <fmt/format.h>

#include <algorithm>

#include "shaping.h"

namespace xagg::bench {
namespace {

double rate_at(const std::vector<double>& rates, size_t index) { return index < rates.size() ? rates[index] : 0; }

}  // namespace

std::vector<LinkDemand> link_demands(const testbed::Layout& layout, uint32_t workers,
                                     const std::vector<double>& worker_gbit,
                                     const std::vector<double>& aggregator_gbit, Aggregation aggregation,
                                     double gradient_bytes) {
  const double g = gradient_bytes;
  const double n = workers;
  std::vector<LinkDemand> links;
  if (layout.colocated) {
    for (uint32_t i = 0; i < workers; ++i) {
      const std::string name = fmt::format("host {}", i);
      if (aggregation == Aggregation::InFirstAggregator) {
        // Host 0 takes every other host's gradient; the others send theirs and receive the result.
        links.push_back({name, rate_at(worker_gbit, i), i == 0 ? (n - 1) * g : g, g});
      } else {
        // Host i receives the other hosts' shares of its shard and their
        // shards' results: 2(N-1)/N G, a ring's bytes too. The results, and
        // the last rank's share of this shard, depend on every rank.
        links.push_back({name, rate_at(worker_gbit, i), 2 * (n - 1) / n * g, g});
      }
    }
    return links;
  }
  for (uint32_t i = 0; i < workers; ++i) {
    // Through aggregators a worker sends its gradient and receives the
    // result; a ring's links carry 2(N-1)/N G each (the least any all-reduce
    // among the workers alone can, Patarasuk and Yuan 2009).
    double total = aggregation == Aggregation::AmongWorkers ? 2 * (n - 1) / n * g : g;
    links.push_back({fmt::format("worker {}", i), rate_at(worker_gbit, i), total, g});
  }
  if (aggregation == Aggregation::AmongWorkers) return links;
  // Aggregator k takes every worker's share of its shard, 1/K of the gradient
  // each, and sends its shard's result once (a broadcast).
  const uint32_t used = aggregation == Aggregation::InFirstAggregator ? 1 : layout.aggregators;
  for (uint32_t index = 0; index < used; ++index)
    links.push_back({fmt::format("aggregator {}", index), rate_at(aggregator_gbit, index), n * g / used, g / used});
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
