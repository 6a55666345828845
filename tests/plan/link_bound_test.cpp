// The link bound's bytes per link, and the aggregator weights that balance
// them (src/plan/link_bound.h).
#include "link_bound.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace xagg::plan {
namespace {

constexpr double kGradient = 1e6;

// Seconds each link needs: bytes over its rate.
std::vector<double> link_times(const std::vector<LinkDemand>& links) {
  std::vector<double> times;
  for (const LinkDemand& link : links) times.push_back(link.total_bytes * 8 / (link.gbit * 1e9));
  return times;
}

TEST(BalancedWeights, EqualLinksOrAnUnshapedOneKeepEqualShares) {
  const testbed::Layout colocated{.aggregators = 1, .colocated = true};
  EXPECT_TRUE(balanced_weights(colocated, 4, {1, 1, 1, 1}, {}).empty());
  EXPECT_TRUE(balanced_weights(colocated, 4, {4, 2, 0, 1}, {}).empty());
  EXPECT_TRUE(balanced_weights({.aggregators = 3, .colocated = false}, 4, {1, 1, 1, 1}, {2, 2, 2}).empty());
  EXPECT_TRUE(balanced_weights({.aggregators = 1, .colocated = false}, 4, {1, 1, 1, 1}, {2}).empty());
}

TEST(BalancedWeights, DedicatedAggregatorsFollowTheirRates) {
  EXPECT_EQ(balanced_weights({.aggregators = 3, .colocated = false}, 4, {1, 1, 1, 1}, {4, 2, 1}),
            (std::vector<uint32_t>{1000, 500, 250}));
}

// Co-located, the weights equalize the hosts' downlink times where they can,
// and the busiest link needs less time than with equal shares.
TEST(BalancedWeights, ColocatedHostsBalanceTheirDownlinks) {
  const testbed::Layout colocated{.aggregators = 1, .colocated = true};
  const std::vector<double> rates{4, 3, 2, 2};
  std::vector<uint32_t> weights = balanced_weights(colocated, 4, rates, {});
  ASSERT_EQ(weights.size(), 4u);
  EXPECT_TRUE(std::ranges::is_sorted(weights, std::greater<>()));
  std::vector<double> balanced =
      link_times(link_demands(colocated, 4, rates, {}, Aggregation::InAggregators, kGradient, weights));
  std::vector<double> equal = link_times(link_demands(colocated, 4, rates, {}, Aggregation::InAggregators, kGradient));
  for (double time : balanced) EXPECT_NEAR(time, balanced.front(), balanced.front() * 0.01);
  EXPECT_LT(*std::ranges::max_element(balanced), *std::ranges::max_element(equal) * 0.95);
  // A host too slow for any share gets the smallest weight; its downlink still carries G.
  weights = balanced_weights(colocated, 4, {4, 2, 1, 0.5}, {});
  EXPECT_EQ(weights.back(), 1u);
  balanced = link_times(link_demands(colocated, 4, {4, 2, 1, 0.5}, {}, Aggregation::InAggregators, kGradient, weights));
  EXPECT_NEAR(balanced.back(), kGradient * 8 / 0.5e9, kGradient * 8 / 0.5e9 * 0.01);
}

}  // namespace
}  // namespace xagg::plan
