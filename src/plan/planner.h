// Plans where a job's aggregators run, from the links (docs/operations.md,
// "Plan a deployment"): for every layout the cluster allows (1..K dedicated
// aggregators, co-located, two-level) and for a ring among the workers, the
// least critical path the links allow a training step, and the layout to use.
//
// The model is the link bound (link_bound.h) applied bucket by bucket: each
// worker produces its gradient's buckets in backward order over its compute
// time; every link carries its bytes of each bucket in order, a bucket's
// bytes no earlier than the first rank has it, and the part that needs every
// rank's share no earlier than the last rank has it. The critical path is
// from the last rank's gradient being complete to the last link being done.
// It counts link bytes only (no CPU, no packet headers, no latency).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "scenario.h"
#include "testbed.h"

namespace xagg::plan {

// What the planner knows of a cluster.
struct ClusterLinks {
  std::vector<double> worker_gbit;      // per worker host's link (both directions); 0: not shaped, never the limit
  std::vector<double> compute_ms;       // per worker: forward and backward of one step
  std::vector<double> aggregator_gbit;  // per host free to be a dedicated aggregator; 0: not shaped
  std::vector<double> bucket_bytes;     // the step's gradient as backward produces it, in that order
  uint32_t workers() const { return static_cast<uint32_t>(worker_gbit.size()); }
};

// One layout and what the model predicts for it.
struct LayoutPlan {
  testbed::Layout layout;
  std::vector<uint32_t> hosts;          // aggregator hosts (indices into aggregator_gbit), in the job's order
  std::vector<double> aggregator_gbit;  // their rates, in that order
  std::vector<uint32_t> weights;        // each aggregator's share; empty: equal (protocol.md section 6)
  double critical_ms = 0;               // predicted least critical path of a step
  std::string bottleneck;               // the link that finishes last; empty when none is shaped
  std::string label() const;            // "1 dedicated", "colocated", "two-level:2", "ring"
};

struct Plan {
  std::vector<LayoutPlan> layouts;  // every aggregator layout the cluster allows, least predicted first
  LayoutPlan ring;                  // an all-reduce among the workers alone (Gloo's ring), for reference
  size_t chosen = 0;                // index into layouts
  const LayoutPlan& choice() const { return layouts[chosen]; }
  // The choice against the ring, within the model's tie margin or beyond it.
  enum class AgainstRing { Faster, Level, Slower };
  AgainstRing against_ring() const;
};
std::string to_string(Plan::AgainstRing verdict);  // "faster", "level", "slower"


// Predictions within this much of each other count as a tie, which goes to
// the layout needing fewer aggregator hosts: the model's own precision.
inline constexpr double kTieFraction = 0.05;
inline constexpr double kTieMs = 1.0;

// Throws std::invalid_argument naming what is wrong: no workers or more than
// the testbed's most, counts that do not match, negative or non-finite rates
// or times, an empty or non-positive gradient.
void check(const ClusterLinks& cluster);

// The plan; throws std::invalid_argument for a bad cluster.
Plan make_plan(const ClusterLinks& cluster);

// The cluster a scenario describes, its gradient in these buckets (elements):
// the workers' links and compute times; the hosts free to be aggregators are
// its aggregator_gbit entries (with "auto", the candidates; otherwise the
// scenario's dedicated aggregators; none when co-located).
ClusterLinks cluster_of(const testbed::Scenario& scenario, const std::vector<uint64_t>& bucket_elements);

// A scenario in "aggregators": "auto" takes the plan's choice: its layout,
// and as aggregator_gbit its hosts' rates in the job's order (the weights
// follow from them, link_bound.h). Returns the plan; throws
// std::runtime_error when the choice leaves a competing flow or ECN marker
// of the scenario without its host. A planned scenario is left as it is.
Plan plan_scenario(testbed::Scenario& scenario, const std::vector<uint64_t>& bucket_elements);

// A scenario file read and planned as above, its gradient from its model's trace (gradient.h).
struct PlannedScenario {
  testbed::Scenario scenario;  // in the planned layout
  ClusterLinks cluster;        // as planned: every host free to be an aggregator
  Plan plan;
};
PlannedScenario plan_scenario_file(const std::filesystem::path& file);

// The plan as a table, one layout a line, the choice marked, and a last line
// that says which layout to use and whether the ring would be faster.
std::string plan_table(const Plan& plan);

}  // namespace xagg::plan
