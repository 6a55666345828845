// The layout planner (src/plan/planner.h): its choice on clusters whose
// answer the link bytes decide, the weights and hosts it gives, the ring
// verdict, its errors on bad input, and "auto" in scenario files.
#include "planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <filesystem>
#include <fstream>

#include "process.h"

namespace xagg::plan {
namespace {

namespace fs = std::filesystem;

// N workers with equal compute, a gradient of 20 MB in 2.5 MB buckets.
ClusterLinks cluster(std::vector<double> worker_gbit, std::vector<double> aggregator_gbit,
                     std::vector<double> compute_ms = {}) {
  ClusterLinks links{.worker_gbit = worker_gbit,
                     .compute_ms = compute_ms,
                     .aggregator_gbit = aggregator_gbit,
                     .bucket_bytes = std::vector<double>(8, 2.5e6)};
  if (links.compute_ms.empty()) links.compute_ms.assign(worker_gbit.size(), 100);
  return links;
}

const LayoutPlan& candidate(const Plan& plan, const std::string& layout) {
  for (const LayoutPlan& candidate : plan.layouts)
    if (candidate.layout.to_string() == layout) return candidate;
  throw std::runtime_error("no candidate " + layout);
}

// The issue's cluster with one fast aggregator host: each worker's own 2 Gbit/s
// link carries its gradient once, where the ring moves 1.5 times it.
TEST(Planner, OneFastAggregatorBeatsTheRing) {
  const Plan plan = make_plan(cluster({2, 2, 2, 2}, {10}));
  EXPECT_EQ(plan.choice().layout.to_string(), "1");
  EXPECT_EQ(plan.choice().hosts, (std::vector<uint32_t>{0}));
  EXPECT_EQ(plan.against_ring(), Plan::AgainstRing::Faster);
  // Backward yields a 2.5 MB bucket every 8.3 ms from 41.7 ms on; a worker's
  // link needs 10 ms for its results, the ring's 15 (1.5 times the bucket),
  // so the links are done 41.7 + 8 x 10 ms and 41.7 + 8 x 15 ms into the step,
  // whose gradient is complete at 100 ms.
  EXPECT_NEAR(plan.choice().critical_ms, 21.7, 0.1);
  EXPECT_NEAR(plan.ring.critical_ms, 61.7, 0.1);
  EXPECT_NE(plan.choice().bottleneck.find("worker"), std::string::npos) << plan.choice().bottleneck;
}

// Two aggregators on links no faster than the workers' carry twice the
// gradient each; co-located aggregators move what a ring moves. The plan takes
// co-located and says plainly that nothing beats the ring.
TEST(Planner, SlowDedicatedAggregatorsLoseToColocatedAndNothingBeatsTheRing) {
  const Plan plan = make_plan(cluster({2, 2, 2, 2}, {2, 2}));
  EXPECT_EQ(plan.choice().layout.to_string(), "colocated");
  EXPECT_GT(candidate(plan, "2").critical_ms, plan.ring.critical_ms * 1.2);
  EXPECT_GT(candidate(plan, "1").critical_ms, candidate(plan, "2").critical_ms);
  EXPECT_EQ(plan.against_ring(), Plan::AgainstRing::Level);
  EXPECT_NE(plan_table(plan).find("No aggregator layout beats the ring"), std::string::npos) << plan_table(plan);
  // Fastest first.
  for (size_t i = 1; i < plan.layouts.size(); ++i)
    EXPECT_LE(plan.layouts[i - 1].critical_ms, plan.layouts[i].critical_ms);
}

// Hosts of different speeds: the fastest serve first, and where several
// serve, each takes a share in proportion to its link.
TEST(Planner, FastestHostsFirstWeightedByTheirLinks) {
  const Plan plan = make_plan(cluster({2, 2, 2, 2}, {2.5, 10}));
  EXPECT_EQ(candidate(plan, "1").hosts, (std::vector<uint32_t>{1}));
  const LayoutPlan& both = candidate(plan, "2");
  EXPECT_EQ(both.hosts, (std::vector<uint32_t>{1, 0}));
  EXPECT_EQ(both.aggregator_gbit, (std::vector<double>{10, 2.5}));
  EXPECT_EQ(both.weights, (std::vector<uint32_t>{1000, 250}));
  // Both are held by the workers' links alike: the tie goes to one host.
  EXPECT_EQ(plan.choice().layout.to_string(), "1");
}

// Slow worker links and one slow host: co-located, with the slow hosts
// holding the least; its weights are the balanced ones.
TEST(Planner, ColocatedWeightsFollowTheHostLinks) {
  const Plan plan = make_plan(cluster({4, 2, 1, 0.5}, {0.5}));
  EXPECT_EQ(plan.choice().layout.to_string(), "colocated");
  ASSERT_EQ(plan.choice().weights.size(), 4u);
  EXPECT_TRUE(std::ranges::is_sorted(plan.choice().weights, std::greater<>()));
  EXPECT_EQ(plan.against_ring(), Plan::AgainstRing::Faster);
}

// Nothing shaped: every layout is free of link limits, and the tie goes to the fewest hosts.
TEST(Planner, UnshapedLinksTieToOneAggregator) {
  const Plan plan = make_plan(cluster({0, 0, 0, 0}, {0, 0, 0}));
  EXPECT_EQ(plan.choice().layout.to_string(), "1");
  for (const LayoutPlan& layout : plan.layouts) EXPECT_EQ(layout.critical_ms, 0) << layout.label();
}

// Compute skew hides link time behind the slowest rank: the early buckets
// cross while it computes, only what follows its last bucket counts.
TEST(Planner, ComputeSkewHidesEarlyBuckets) {
  const Plan even = make_plan(cluster({2, 2, 2, 2}, {2}));
  const Plan skewed = make_plan(cluster({2, 2, 2, 2}, {2}, {100, 150, 200, 300}));
  EXPECT_LT(candidate(skewed, "1").critical_ms, candidate(even, "1").critical_ms * 0.5);
}

// Past one aggregator's 64 ranks only two levels are possible; on slow
// aggregator hosts they lose to the ring, and the plan says so.
TEST(Planner, ManyRanksNeedTwoLevels) {
  const Plan plan = make_plan(cluster(std::vector<double>(80, 10), {1, 1, 1}));
  ASSERT_EQ(plan.layouts.size(), 1u);
  EXPECT_EQ(plan.choice().layout.to_string(), "two-level:2");
  EXPECT_EQ(plan.against_ring(), Plan::AgainstRing::Slower);
  EXPECT_NE(plan_table(plan).find("Use the ring"), std::string::npos) << plan_table(plan);
}

class BadCluster : public testing::TestWithParam<std::pair<ClusterLinks, std::string>> {};

TEST_P(BadCluster, IsRefusedNamingTheProblem) {
  const auto& [links, expected] = GetParam();
  try {
    make_plan(links);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
  }
}

ClusterLinks with(ClusterLinks links, const std::function<void(ClusterLinks&)>& change) {
  change(links);
  return links;
}

INSTANTIATE_TEST_SUITE_P(
    Inputs, BadCluster,
    testing::Values(
        std::pair{cluster({2}, {10}), "1 workers: a plan needs 2..250"},
        std::pair{with(cluster({2, 2}, {10}), [](ClusterLinks& c) { c.compute_ms = {1}; }),
                  "1 compute times for 2 workers"},
        std::pair{cluster({2, -1}, {10}), "worker_gbit[1] is -1"},
        std::pair{cluster({2, 2}, {NAN}), "aggregator_gbit[0] is nan"},
        std::pair{cluster({2, 2}, {10}, {100, INFINITY}), "compute_ms[1] is inf"},
        std::pair{with(cluster({2, 2}, {10}), [](ClusterLinks& c) { c.bucket_bytes.clear(); }),
                  "the gradient has no buckets"},
        std::pair{with(cluster({2, 2}, {10}), [](ClusterLinks& c) { c.bucket_bytes = {1e6, 0}; }),
                  "buckets must be positive"},
        std::pair{cluster({2, 2}, std::vector<double>(65, 1)), "65 aggregator hosts: at most 64"},
        std::pair{cluster(std::vector<double>(80, 1), {1, 1}), "past 64 ranks a job needs two levels"}));

// A scenario in "auto" takes the plan's layout and its hosts' rates.
TEST(Planner, AutoScenarioTakesThePlannedLayout) {
  TempDirectory directory("xagg-test-plan");
  const fs::path file = directory.path() / "auto.json";
  std::ofstream(file) << R"({"workers": 4, "compute_ms": [100, 100, 100, 100], "worker_gbit": [2, 2, 2, 2],
                             "aggregators": "auto", "aggregator_gbit": [2.5, 10]})";
  testbed::Scenario scenario = testbed::load_scenario(file);
  EXPECT_TRUE(scenario.layout.automatic);
  EXPECT_EQ(scenario.layout.aggregators, 2u);
  const Plan plan = plan_scenario(scenario, std::vector<uint64_t>(4, 625000));
  EXPECT_FALSE(scenario.layout.automatic);
  EXPECT_EQ(scenario.layout, plan.choice().layout);
  EXPECT_EQ(scenario.layout.to_string(), "1");
  EXPECT_EQ(scenario.aggregator_gbit, (std::vector<double>{10}));
}

// A testbed cannot come up in a layout nobody has chosen.
TEST(Planner, TestbedRefusesAnUnplannedLayout) {
  testbed::Testbed bed("xplan-never");
  try {
    bed.up(4, testbed::Layout::parse("auto"));
    ADD_FAILURE() << "came up";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("aggregators auto"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(bed.existing_namespaces().empty());
}

// Every shipped scenario plans; a scenario with its own layout keeps it.
TEST(Planner, EveryShippedScenarioPlans) {
  for (const auto& entry : fs::directory_iterator(XAGG_SCENARIOS_DIR)) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    const testbed::Scenario original = testbed::load_scenario(entry.path());
    const PlannedScenario planned = plan_scenario_file(entry.path());
    EXPECT_FALSE(planned.scenario.layout.automatic);
    if (!original.layout.automatic) EXPECT_EQ(planned.scenario.layout, original.layout);
    EXPECT_GE(planned.plan.ring.critical_ms, 0);
  }
}

}  // namespace
}  // namespace xagg::plan
