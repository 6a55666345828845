#include "link_bound.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "shaping.h"

namespace xagg::plan {
namespace {

double rate_at(const std::vector<double>& rates, size_t index) { return index < rates.size() ? rates[index] : 0; }

// Each aggregator's share of the job, summing to 1.
std::vector<double> shares(const std::vector<uint32_t>& weights, uint32_t aggregators) {
  if (weights.empty()) return std::vector<double>(aggregators, 1.0 / aggregators);
  double sum = 0;
  for (uint32_t weight : weights) sum += weight;
  std::vector<double> result;
  for (uint32_t weight : weights) result.push_back(weight / sum);
  return result;
}

// Integer weights in proportion to these shares, the largest kMaxWeight.
std::vector<uint32_t> to_weights(const std::vector<double>& shares) {
  const double largest = *std::ranges::max_element(shares);
  std::vector<uint32_t> weights;
  for (double share : shares)
    weights.push_back(std::max<uint32_t>(1, static_cast<uint32_t>(std::lround(share / largest * kMaxWeight))));
  if (std::ranges::all_of(weights, [&](uint32_t weight) { return weight == weights.front(); })) return {};
  return weights;
}

}  // namespace

Aggregation aggregation_of(testbed::AggregatorKind kind, const testbed::Layout& layout) {
  switch (kind) {
    case testbed::AggregatorKind::Gloo: return Aggregation::AmongWorkers;
    case testbed::AggregatorKind::Switch:
    case testbed::AggregatorKind::SwitchJumbo: return Aggregation::InFirstAggregator;
    case testbed::AggregatorKind::Xdp:
    case testbed::AggregatorKind::XdpTxResults:
      return layout.two_level ? Aggregation::InTwoLevels : Aggregation::InAggregators;
    case testbed::AggregatorKind::Userspace:
    case testbed::AggregatorKind::TcpPs: break;
  }
  return Aggregation::InAggregators;
}

std::vector<LinkDemand> link_demands(const testbed::Layout& layout, uint32_t workers,
                                     const std::vector<double>& worker_gbit,
                                     const std::vector<double>& aggregator_gbit, Aggregation aggregation,
                                     double gradient_bytes, const std::vector<uint32_t>& weights) {
  const double g = gradient_bytes;
  const double n = workers;
  std::vector<LinkDemand> links;
  if (layout.colocated) {
    const std::vector<double> share = shares(weights, workers);
    for (uint32_t i = 0; i < workers; ++i) {
      const std::string name = fmt::format("host {}", i);
      if (aggregation == Aggregation::InFirstAggregator) {
        // Host 0 takes every other host's gradient; the others send theirs and receive the result.
        links.push_back({name, rate_at(worker_gbit, i), i == 0 ? (n - 1) * g : g, g});
      } else {
        // Host i receives the other hosts' shares of its shard and their
        // shards' results, (N-1) w G + (1-w) G: 2(N-1)/N G for equal shares,
        // a ring's bytes too. It sends G. The results, and the last rank's
        // share of this shard, depend on every rank.
        links.push_back({name, rate_at(worker_gbit, i), std::max(g, (1 + (n - 2) * share[i]) * g), g});
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
  if (aggregation == Aggregation::InTwoLevels) {
    // Leaf l takes its S_l ranks' gradients and the root's result, and sends
    // its sum up and the result down once; the root takes every leaf's sum and
    // sends each leaf the result (unicast).
    const uint32_t leaves = layout.aggregators - 1;
    const uint32_t per_leaf = layout.ranks_per_leaf(workers);
    for (uint32_t leaf = 0; leaf < leaves; ++leaf) {
      const double ranks = std::min(per_leaf, workers - leaf * per_leaf);
      links.push_back({fmt::format("aggregator {}", leaf), rate_at(aggregator_gbit, leaf), (ranks + 1) * g, g});
    }
    links.push_back({fmt::format("aggregator {}", leaves), rate_at(aggregator_gbit, leaves), leaves * g, g});
    return links;
  }
  // Aggregator k takes every worker's share of its shard, 1/K of the gradient
  // each, and sends its shard's result once (a broadcast).
  const uint32_t used = aggregation == Aggregation::InFirstAggregator ? 1 : layout.aggregators;
  const std::vector<double> share = shares(used == 1 ? std::vector<uint32_t>{} : weights, used);
  for (uint32_t index = 0; index < used; ++index)
    links.push_back({fmt::format("aggregator {}", index), rate_at(aggregator_gbit, index), n * g * share[index],
                     g * share[index]});
  return links;
}

std::vector<uint32_t> balanced_weights(const testbed::Layout& layout, uint32_t workers,
                                       const std::vector<double>& worker_gbit,
                                       const std::vector<double>& aggregator_gbit) {
  const uint32_t count = layout.colocated ? workers : layout.aggregators;
  std::vector<double> rates;
  for (uint32_t index = 0; index < count; ++index)
    rates.push_back(rate_at(layout.colocated ? worker_gbit : aggregator_gbit, index));
  if (count < 2 || std::ranges::any_of(rates, [](double rate) { return rate <= 0; })) return {};
  if (!layout.colocated || workers <= 2) return to_weights(rates);  // N = 2: every share costs the same
  // Host i's downlink time is (1 + (N-2) w_i) / r_i: the least largest one
  // makes them equal, T, except where w_i would fall below the smallest
  // share a weight can give; bisect T until the shares sum to 1.
  const double n = workers;
  const double floor = 1.0 / kMaxWeight;
  auto shares_for = [&](double time) {
    std::vector<double> result;
    for (double rate : rates) result.push_back(std::max(floor, (time * rate - 1) / (n - 2)));
    return result;
  };
  auto sum = [](const std::vector<double>& values) { return std::accumulate(values.begin(), values.end(), 0.0); };
  double low = 0, high = (n - 1) / *std::ranges::min_element(rates);  // there the slowest host's share alone is 1
  for (int step = 0; step < 100; ++step) {
    const double middle = (low + high) / 2;
    (sum(shares_for(middle)) > 1 ? high : low) = middle;
  }
  return to_weights(shares_for(high));
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

}  // namespace xagg::plan
