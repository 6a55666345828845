#include "planner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "cluster.h"
#include "gradient.h"
#include "link_bound.h"
#include "xagg_wire.h"

namespace xagg::plan {
namespace {

// When each bucket of the step is ready: at the first rank, at the last rank
// (ms from the step's start), and when the last rank's whole gradient is.
// As the bench's ranks do (src/bench/bench_hetero.cpp): forward takes a third
// of the compute, backward the rest, spread over the buckets by size.
struct Timeline {
  std::vector<double> any_ready_ms, every_ready_ms;
  double last_ready_ms = 0;
};

Timeline timeline_of(const ClusterLinks& cluster) {
  const double total = std::accumulate(cluster.bucket_bytes.begin(), cluster.bucket_bytes.end(), 0.0);
  Timeline timeline;
  double produced = 0;
  for (double bucket : cluster.bucket_bytes) {
    produced += bucket;
    double any = INFINITY, every = 0;
    for (double compute : cluster.compute_ms) {
      const double ready = compute / 3 + compute * 2 / 3 * produced / total;
      any = std::min(any, ready);
      every = std::max(every, ready);
    }
    timeline.any_ready_ms.push_back(any);
    timeline.every_ready_ms.push_back(every);
  }
  timeline.last_ready_ms = *std::ranges::max_element(cluster.compute_ms);
  return timeline;
}

// The link bound bucket by bucket: each link carries its bytes of every
// bucket in order, no earlier than the first rank has the bucket, and the
// part that needs every rank's share no earlier than the last rank has it.
void predict(LayoutPlan& plan, const std::vector<LinkDemand>& links, const ClusterLinks& cluster,
             const Timeline& timeline) {
  const double total = std::accumulate(cluster.bucket_bytes.begin(), cluster.bucket_bytes.end(), 0.0);
  double last_done_ms = 0;
  for (const LinkDemand& link : links) {
    if (link.gbit <= 0) continue;
    const double bytes_per_ms = link.gbit * 1e9 / 8 / 1e3;
    double done_ms = 0;
    for (size_t b = 0; b < cluster.bucket_bytes.size(); ++b) {
      const double fraction = cluster.bucket_bytes[b] / total;
      done_ms = std::max({std::max(done_ms, timeline.any_ready_ms[b]) + link.total_bytes * fraction / bytes_per_ms,
                          timeline.every_ready_ms[b] + link.dependent_bytes * fraction / bytes_per_ms});
    }
    if (done_ms > last_done_ms) {
      last_done_ms = done_ms;
      plan.bottleneck = link.name;
    }
  }
  plan.critical_ms = std::max(0.0, last_done_ms - timeline.last_ready_ms);
  if (plan.critical_ms == 0) plan.bottleneck.clear();
}

// Hosts fastest first (an unshaped one is the fastest), the earlier one first among equals.
std::vector<uint32_t> hosts_fastest_first(const std::vector<double>& gbit) {
  std::vector<uint32_t> order(gbit.size());
  std::iota(order.begin(), order.end(), 0);
  auto speed = [&](uint32_t host) { return gbit[host] <= 0 ? INFINITY : gbit[host]; };
  std::ranges::stable_sort(order, [&](uint32_t a, uint32_t b) { return speed(a) > speed(b); });
  return order;
}

// Among layouts the model cannot tell apart, the one needing the fewest
// aggregator hosts; co-located last, as it takes CPU from every worker.
uint32_t preference(const testbed::Layout& layout) {
  if (layout.colocated) return 1000;
  if (layout.two_level) return 2000 + layout.aggregators;
  return layout.aggregators;
}

bool within_tie(double candidate_ms, double best_ms) {
  return candidate_ms <= best_ms * (1 + kTieFraction) + kTieMs;
}

void check_rates(const std::vector<double>& values, const char* what) {
  for (size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]) || values[i] < 0)
      throw std::invalid_argument(fmt::format("{}[{}] is {}: must be a finite number >= 0", what, i, values[i]));
}

}  // namespace

std::string LayoutPlan::label() const {
  if (layout.colocated) return "colocated";
  if (layout.two_level) return layout.to_string();
  if (layout.aggregators == 0) return "ring";
  return fmt::format("{} dedicated", layout.aggregators);
}

Plan::AgainstRing Plan::against_ring() const {
  if (!within_tie(choice().critical_ms, ring.critical_ms)) return AgainstRing::Slower;
  if (!within_tie(ring.critical_ms, choice().critical_ms)) return AgainstRing::Faster;
  return AgainstRing::Level;
}

std::string to_string(Plan::AgainstRing verdict) {
  switch (verdict) {
    case Plan::AgainstRing::Faster: return "faster";
    case Plan::AgainstRing::Level: return "level";
    case Plan::AgainstRing::Slower: break;
  }
  return "slower";
}

void check(const ClusterLinks& cluster) {
  const uint32_t workers = cluster.workers();
  if (workers < 2 || workers > testbed::kMaxWorkers)
    throw std::invalid_argument(fmt::format("{} workers: a plan needs 2..{}", workers, testbed::kMaxWorkers));
  if (cluster.compute_ms.size() != workers)
    throw std::invalid_argument(fmt::format("{} compute times for {} workers: give one per worker (or one for all)",
                                            cluster.compute_ms.size(), workers));
  if (cluster.aggregator_gbit.size() > testbed::kMaxAggregators)
    throw std::invalid_argument(fmt::format("{} aggregator hosts: at most {}", cluster.aggregator_gbit.size(),
                                            testbed::kMaxAggregators));
  check_rates(cluster.worker_gbit, "worker_gbit");
  check_rates(cluster.aggregator_gbit, "aggregator_gbit");
  check_rates(cluster.compute_ms, "compute_ms");
  if (cluster.bucket_bytes.empty()) throw std::invalid_argument("the gradient has no buckets");
  for (double bytes : cluster.bucket_bytes)
    if (!std::isfinite(bytes) || bytes <= 0)
      throw std::invalid_argument(fmt::format("a gradient bucket of {} bytes: buckets must be positive", bytes));
}

Plan make_plan(const ClusterLinks& cluster) {
  check(cluster);
  const uint32_t workers = cluster.workers();
  const double gradient = std::accumulate(cluster.bucket_bytes.begin(), cluster.bucket_bytes.end(), 0.0);
  const Timeline timeline = timeline_of(cluster);
  const std::vector<uint32_t> fastest = hosts_fastest_first(cluster.aggregator_gbit);

  Plan plan;
  auto add = [&](testbed::Layout layout, uint32_t hosts) {
    LayoutPlan candidate;
    candidate.layout = layout;
    candidate.hosts.assign(fastest.begin(), fastest.begin() + hosts);
    for (uint32_t host : candidate.hosts) candidate.aggregator_gbit.push_back(cluster.aggregator_gbit[host]);
    if (!layout.two_level)
      candidate.weights = balanced_weights(layout, workers, cluster.worker_gbit, candidate.aggregator_gbit);
    const auto aggregation = layout.two_level ? Aggregation::InTwoLevels : Aggregation::InAggregators;
    predict(candidate,
            link_demands(layout, workers, cluster.worker_gbit, candidate.aggregator_gbit, aggregation, gradient,
                         candidate.weights),
            cluster, timeline);
    plan.layouts.push_back(std::move(candidate));
  };
  // One level holds one aggregator's ranks at most; past them only two levels.
  if (workers <= XAGG_MAX_WORKERS) {
    for (uint32_t k = 1; k <= fastest.size(); ++k) add({.aggregators = k}, k);
    add({.aggregators = 1, .colocated = true}, 0);
  }
  for (uint32_t leaves = 2; leaves + 1 <= fastest.size(); ++leaves) {
    const testbed::Layout layout{.aggregators = leaves + 1, .colocated = false, .routed = false, .two_level = true};
    try {
      layout.ranks_per_leaf(workers);
    } catch (const std::invalid_argument&) {
      continue;  // these workers do not fill that many leaves
    }
    add(layout, leaves + 1);
  }
  if (plan.layouts.empty())
    throw std::invalid_argument(fmt::format(
        "no aggregator layout for {} workers: past {} ranks a job needs two levels, at least 3 aggregator hosts "
        "(2 leaves and a root) of which the leaves hold at most {} ranks each",
        workers, XAGG_MAX_WORKERS, XAGG_MAX_WORKERS));

  std::ranges::stable_sort(plan.layouts, [](const LayoutPlan& a, const LayoutPlan& b) {
    return a.critical_ms < b.critical_ms ||
           (a.critical_ms == b.critical_ms && preference(a.layout) < preference(b.layout));
  });
  const double best_ms = plan.layouts.front().critical_ms;
  for (size_t i = 0; i < plan.layouts.size(); ++i)
    if (within_tie(plan.layouts[i].critical_ms, best_ms) &&
        preference(plan.layouts[i].layout) < preference(plan.layouts[plan.chosen].layout))
      plan.chosen = i;

  // The ring: every link carries 2(N-1)/N of each bucket, all of it after
  // every rank has the bucket, at the pace of the slowest link (each of its
  // steps waits for every rank's previous one).
  plan.ring.layout = {.aggregators = 0};
  std::vector<LinkDemand> ring_links = link_demands({}, workers, cluster.worker_gbit, {}, Aggregation::AmongWorkers,
                                                    gradient);
  double slowest = INFINITY;
  for (double gbit : cluster.worker_gbit)
    if (gbit > 0) slowest = std::min(slowest, gbit);
  for (LinkDemand& link : ring_links) {
    link.dependent_bytes = link.total_bytes;
    link.gbit = std::isfinite(slowest) ? slowest : 0;
  }
  predict(plan.ring, ring_links, cluster, timeline);
  return plan;
}

ClusterLinks cluster_of(const testbed::Scenario& scenario, const std::vector<uint64_t>& bucket_elements) {
  ClusterLinks cluster;
  cluster.worker_gbit = scenario.worker_gbit;
  cluster.worker_gbit.resize(scenario.workers, 0.0);  // no worker_gbit: unshaped
  cluster.compute_ms = scenario.compute_ms;
  if (!scenario.layout.colocated) cluster.aggregator_gbit = scenario.aggregator_gbit;
  for (uint64_t elements : bucket_elements) cluster.bucket_bytes.push_back(double(elements) * sizeof(float));
  return cluster;
}

Plan plan_scenario(testbed::Scenario& scenario, const std::vector<uint64_t>& bucket_elements) {
  Plan plan = make_plan(cluster_of(scenario, bucket_elements));
  if (!scenario.layout.automatic) return plan;
  const LayoutPlan& choice = plan.choice();
  scenario.layout = choice.layout;
  scenario.aggregator_gbit = choice.aggregator_gbit;
  try {
    testbed::check_congestion_fields(scenario);
  } catch (const std::runtime_error& error) {
    throw std::runtime_error(fmt::format("scenario {}: aggregators auto chose {}: {}", scenario.name,
                                         choice.layout.to_string(), error.what()));
  }
  return plan;
}

PlannedScenario plan_scenario_file(const std::filesystem::path& file) {
  PlannedScenario planned{.scenario = testbed::load_scenario(file), .cluster = {}, .plan = {}};
  const testbed::Scenario& scenario = planned.scenario;
  const auto buckets = backward_buckets(trace_file(file, scenario.model), scenario.gradient_scale, scenario.bucket_mb);
  planned.cluster = cluster_of(scenario, buckets);
  planned.plan = plan_scenario(planned.scenario, buckets);
  return planned;
}

std::string plan_table(const Plan& plan) {
  auto hosts = [](const LayoutPlan& layout) {
    return layout.hosts.empty() ? std::string("-") : fmt::format("{}", fmt::join(layout.hosts, ","));
  };
  auto weights = [](const LayoutPlan& layout) {
    return layout.weights.empty() ? std::string("equal") : fmt::format("{}", fmt::join(layout.weights, ","));
  };
  // Columns as wide as their longest entry, so that many hosts still line up.
  size_t hosts_width = 14, weights_width = 16;
  for (const LayoutPlan& layout : plan.layouts) {
    hosts_width = std::max(hosts_width, hosts(layout).size());
    weights_width = std::max(weights_width, weights(layout).size());
  }
  auto row = [&](char mark, const std::string& layout, const std::string& host_list, const std::string& weight_list,
                 const std::string& critical, const std::string& bottleneck) {
    return fmt::format("{} {:<13} {:<{}} {:<{}} {:>12}  {}\n", mark, layout, host_list, hosts_width, weight_list,
                       weights_width, critical, bottleneck.empty() ? "-" : bottleneck);
  };
  std::string table = row(' ', "--aggregators", "hosts", "weights", "critical ms", "bottleneck");
  for (size_t i = 0; i < plan.layouts.size(); ++i) {
    const LayoutPlan& layout = plan.layouts[i];
    table += row(i == plan.chosen ? '*' : ' ', layout.layout.to_string(), hosts(layout), weights(layout),
                 fmt::format("{:.1f}", layout.critical_ms), layout.bottleneck);
  }
  table += row(' ', "(ring)", "-", "-", fmt::format("{:.1f}", plan.ring.critical_ms), plan.ring.bottleneck);
  const LayoutPlan& choice = plan.choice();
  switch (plan.against_ring()) {
    case Plan::AgainstRing::Faster:
      table += fmt::format("Use {}: predicted {:.1f} ms against the ring's {:.1f} ms.\n", choice.label(),
                           choice.critical_ms, plan.ring.critical_ms);
      break;
    case Plan::AgainstRing::Level:
      table += fmt::format(
          "No aggregator layout beats the ring here: the best, {}, is predicted level with it ({:.1f} ms against "
          "{:.1f} ms). Use {} with XAgg, or the ring (Gloo, NCCL).\n",
          choice.label(), choice.critical_ms, plan.ring.critical_ms, choice.label());
      break;
    case Plan::AgainstRing::Slower:
      table += fmt::format(
          "No aggregator layout beats the ring here: the best, {}, is predicted at {:.1f} ms against the ring's "
          "{:.1f} ms. Use the ring (Gloo, NCCL); with XAgg, {} is the least slow.\n",
          choice.label(), choice.critical_ms, plan.ring.critical_ms, choice.label());
      break;
  }
  return table;
}

}  // namespace xagg::plan
