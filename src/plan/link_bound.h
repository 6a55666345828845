// What the links of a testbed layout allow an all-reduce at best: the bytes
// each link must carry per all-reduce, and the time that takes. Both benches
// print it beside every system (docs/evaluation.md, "link bound"), and the
// planner (planner.h) ranks layouts by it.
#pragma once

#include <string>
#include <vector>

#include "cluster.h"
#include "testbed.h"

namespace xagg::plan {

// How a system combines the gradients: in the layout's aggregators, with equal
// shares (XAgg, the TCP PS), in the first aggregator only (the switch
// baseline, which models one switch), among the workers themselves (Gloo's
// ring), or in leaves and a root (XAgg on a two-level layout).
enum class Aggregation { InAggregators, InFirstAggregator, AmongWorkers, InTwoLevels };

// How `kind` aggregates on `layout`.
Aggregation aggregation_of(testbed::AggregatorKind kind, const testbed::Layout& layout);

// One link, shaped alike in both directions, and what its busier direction
// must carry for an all-reduce of a gradient of G bytes (headers not counted).
struct LinkDemand {
  std::string name;            // "worker 0", "aggregator 1", "host 2"
  double gbit = 0;             // 0: unshaped, never the limit
  double total_bytes = 0;
  // The part that depends on every rank's gradient, so that it cannot cross
  // before the last rank has produced its first bytes.
  double dependent_bytes = 0;
};

// The links of the layout. worker_gbit has an entry per worker, aggregator_gbit
// one per dedicated aggregator (none when co-located); 0 or missing: unshaped.
// weights: each aggregator's share of the job (protocol.md section 6); empty: equal.
std::vector<LinkDemand> link_demands(const testbed::Layout& layout, uint32_t workers,
                                     const std::vector<double>& worker_gbit,
                                     const std::vector<double>& aggregator_gbit, Aggregation aggregation,
                                     double gradient_bytes, const std::vector<uint32_t>& weights = {});

// Aggregator weights (1..kMaxWeight) under which the layout's busiest link
// direction takes the least time, as a deployment would set them from its
// link rates: a dedicated aggregator's inbound carries N times its share, so
// its weight follows its rate; a co-located host's downlink carries
// G (1 + (N-2) w) for share w, so the shares equalize that time across hosts
// (water-filling, the slowest hosts down to the smallest weight). Equal
// (empty) when any link is unshaped or all rates are equal.
inline constexpr uint32_t kMaxWeight = 1000;
std::vector<uint32_t> balanced_weights(const testbed::Layout& layout, uint32_t workers,
                                       const std::vector<double>& worker_gbit,
                                       const std::vector<double>& aggregator_gbit);

// Seconds the busiest shaped link needs for its bytes; 0 when none is shaped.
double link_seconds(const std::vector<LinkDemand>& links);

// The least critical path (last rank ready -> last result) the links allow,
// given when the first rank's and the last rank's first bytes were ready and
// when the last rank's gradient was complete (microseconds): each link
// carries its bytes from the first one on and its dependent bytes from the
// last one's on, less what tbf's bucket lets through at once.
double link_bound_ms(const std::vector<LinkDemand>& links, double any_first_ready_us, double every_first_ready_us,
                     double last_ready_us);

}  // namespace xagg::plan
