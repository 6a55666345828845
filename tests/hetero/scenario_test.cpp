// Scenario files (docs/evaluation.md): every shipped file loads, and a bad one
// is refused with a message that names what is wrong.
#include "scenario.h"

#include "process.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace xagg::testbed {
namespace {

namespace fs = std::filesystem;

TEST(Scenario, EveryShippedFileLoads) {
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(XAGG_SCENARIOS_DIR)) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    Scenario scenario = load_scenario(entry.path());
    EXPECT_EQ(scenario.name, entry.path().stem().string());
    EXPECT_TRUE(fs::exists(fs::path(XAGG_TRACES_DIR) / (scenario.model + ".json"))) << scenario.model;
    ++files;
  }
  EXPECT_GE(files, 10u);
}

// Loads a scenario file with this content, in a directory of its own (ctest
// runs these tests in parallel); removed again, also when loading throws.
Scenario load_text(const std::string& body) {
  TempDirectory directory("xagg-test-scenario");
  const fs::path path = directory.path() / "scenario.json";
  std::ofstream(path) << body;
  return load_scenario(path);
}

// "auto": the hosts free to be dedicated aggregators, one rate each; the layout is the planner's (src/plan).
TEST(Scenario, AutoListsTheHostsFreeToAggregate) {
  Scenario scenario = load_text(R"({"workers": 2, "aggregators": "auto", "aggregator_gbit": [10, 2, 2]})");
  EXPECT_TRUE(scenario.layout.automatic);
  EXPECT_EQ(scenario.layout.aggregators, 3u);
  EXPECT_EQ(scenario.layout.to_string(), "auto");
  EXPECT_EQ(scenario.aggregator_gbit, (std::vector<double>{10, 2, 2}));
  EXPECT_EQ(load_text(R"({"workers": 2, "aggregators": "auto", "aggregator_gbit": 4})").aggregator_gbit,
            (std::vector<double>{4}));
  EXPECT_TRUE(load_text(R"({"workers": 2, "aggregators": "auto"})").aggregator_gbit.empty());
}

TEST(Scenario, AggregatorsDefaultToOneAggregatorHost) {
  Scenario scenario = load_text(R"({"workers": 2, "aggregator_gbit": 10})");
  EXPECT_EQ(scenario.layout, Layout{});
  EXPECT_EQ(scenario.aggregator_gbit, std::vector<double>{10});
  EXPECT_EQ(load_text(R"({"workers": 2})").aggregator_gbit, std::vector<double>{0});  // unshaped
}

TEST(Scenario, OneAggregatorRateAppliesToEveryDedicatedAggregator) {
  Scenario scenario = load_text(R"({"workers": 2, "aggregators": 3, "aggregator_gbit": 10})");
  EXPECT_EQ(scenario.layout, (Layout{.aggregators = 3, .colocated = false}));
  EXPECT_EQ(scenario.aggregator_gbit, (std::vector<double>{10, 10, 10}));
  scenario = load_text(R"({"workers": 2, "aggregators": 3, "aggregator_gbit": [1, 0, 2.5]})");
  EXPECT_EQ(scenario.aggregator_gbit, (std::vector<double>{1, 0, 2.5}));
  EXPECT_EQ(load_text(R"({"workers": 2, "aggregators": 2})").aggregator_gbit, (std::vector<double>{0, 0}));
}

TEST(Scenario, ColocatedAggregatorsHaveNoLinkOfTheirOwn) {
  Scenario scenario = load_text(R"({"workers": 2, "aggregators": "colocated", "worker_gbit": [1, 2]})");
  EXPECT_TRUE(scenario.layout.colocated);
  EXPECT_TRUE(scenario.aggregator_gbit.empty());
}

// The routed layout: one dedicated aggregator, the workers on two subnets behind a router.
TEST(Scenario, RoutedLayoutHasOneDedicatedAggregator) {
  Scenario scenario = load_text(R"({"workers": 4, "aggregators": "routed", "aggregator_gbit": 5})");
  EXPECT_EQ(scenario.layout, Layout::parse("routed"));
  EXPECT_EQ(scenario.layout.to_string(), "routed");
  EXPECT_EQ(scenario.aggregator_gbit, (std::vector<double>{5}));
}

// Two levels: L leaves and a root, the root's link last among the aggregators'; past 64 workers.
TEST(Scenario, TwoLevelLayoutHasItsLeavesAndARoot) {
  Scenario scenario =
      load_text(R"({"workers": 72, "aggregators": "two-level:3", "aggregator_gbit": [1, 1, 1, 4]})");
  EXPECT_EQ(scenario.layout, (Layout{.aggregators = 4, .colocated = false, .routed = false, .two_level = true}));
  EXPECT_EQ(scenario.layout.to_string(), "two-level:3");
  EXPECT_EQ(scenario.aggregator_gbit, (std::vector<double>{1, 1, 1, 4}));
}

TEST(Scenario, CompetingFlowsAndEcnMarkingNameHostsAndLinks) {
  const Scenario scenario = load_text(R"({"workers": 2, "aggregators": 2, "aggregator_gbit": [1, 0],
      "worker_gbit": [0.5, 0],
      "competing_flows": [{"from": "worker 1", "to": "aggregator 0"}, {"from": "aggregator 1", "to": "worker 0"}],
      "ecn_marking": [{"link": "aggregator 0", "threshold_kb": 30}, {"link": "worker 0", "threshold_kb": 64,
                       "rate_fraction": 0.95}]})");
  ASSERT_EQ(scenario.competing_flows.size(), 2u);
  EXPECT_EQ(scenario.competing_flows[0].from, (HostRef{HostRef::Role::Worker, 1}));
  EXPECT_EQ(scenario.competing_flows[0].to, (HostRef{HostRef::Role::Aggregator, 0}));
  EXPECT_EQ(scenario.competing_flows[1].label(), "aggregator 1 -> worker 0");
  ASSERT_EQ(scenario.ecn_marking.size(), 2u);
  EXPECT_EQ(scenario.ecn_marking[0].link.to_string(), "aggregator 0");
  EXPECT_EQ(scenario.ecn_marking[0].threshold_kb, 30);
  EXPECT_EQ(scenario.ecn_marking[0].rate_fraction, 1.0);  // the default: the phantom queue follows tbf's
  EXPECT_EQ(scenario.ecn_marking[1].rate_fraction, 0.95);
  EXPECT_EQ(link_gbit(scenario, scenario.ecn_marking[1].link), 0.5);
  // Co-located, a host's worker and aggregator talk over no link, but across hosts they do.
  EXPECT_EQ(load_text(R"({"workers": 2, "aggregators": "colocated",
                          "competing_flows": [{"from": "worker 0", "to": "aggregator 1"}]})")
                .competing_flows.size(),
            1u);
}

// "wire_bits": 32 unless the file says 16.
TEST(Scenario, WireBitsDefaultTo32) {
  EXPECT_EQ(load_text(R"({"workers": 2})").wire_bits, 32u);
  EXPECT_EQ(load_text(R"({"workers": 2, "wire_bits": 16, "systems": ["xagg", "gloo"]})").wire_bits, 16u);
}

class BadScenario : public testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(BadScenario, IsRefusedNamingTheProblem) {
  const auto& [body, expected] = GetParam();
  try {
    load_text(body);
    ADD_FAILURE() << "accepted: " << body;
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Files, BadScenario,
    testing::Values(
        std::pair{R"({"workers": 2, "compute_ms": [1, 2], "worker_gbit": [1, 1],)", "not JSON"},
        std::pair{R"([1, 2])", "not a JSON object"},
        std::pair{R"({"workers": 2, "compute_ms": [1, 2], "compute_jiter": 0.1})", "unknown field \"compute_jiter\""},
        // A value of the wrong type is refused naming its field; no silent conversion of
        // 2.9 or -2 to an unsigned count, nor of true to a number.
        std::pair{R"({"workers": "four"})", "workers: expected an integer"},
        std::pair{R"({"workers": 2.9, "compute_ms": [1, 2]})", "workers: expected an integer"},
        std::pair{R"({"workers": -2})", "workers: expected an integer"},
        std::pair{R"({"workers": 4294967298, "compute_ms": [1, 2]})", "workers: expected an integer"},
        std::pair{R"({"workers": true})", "workers: expected an integer"},
        std::pair{R"({"workers": 2, "compute_ms": [1, 2], "loss": true})", "loss: expected a number"},
        std::pair{R"({"workers": 2, "compute_ms": [1, 2], "bucket_mb": "25"})", "bucket_mb: expected a number"},
        std::pair{R"({"workers": 2, "compute_ms": [1, false]})", "compute_ms: expected an array of numbers"},
        std::pair{R"({"workers": 2, "compute_ms": 1})", "compute_ms: expected an array of numbers"},
        std::pair{R"({"workers": 2, "compute_ms": [1, 2], "worker_gbit": [1, null]})",
                  "worker_gbit: expected an array of numbers"},
        std::pair{R"({"workers": 2, "compute_ms": [1, 2], "systems": ["xagg", 1]})",
                  "systems: expected an array of strings"},
        std::pair{R"({"name": 7, "workers": 2, "compute_ms": [1, 2]})", "name: expected a string"},
        std::pair{R"({"workers": 2, "compute_ms": [1, 2], "model": null})", "model: expected a string"},
        std::pair{R"({"workers": 1, "compute_ms": [1]})", "workers must be 2..64"},
        std::pair{R"({"workers": 65})", "workers must be 2..64"},
        std::pair{R"({"workers": 2, "compute_ms": [1]})", "compute_ms needs one entry per worker"},
        std::pair{R"({"workers": 2, "compute_ms": [1, -1]})", "compute_ms must not be negative"},
        std::pair{R"({"workers": 2, "compute_ms": [1, 1], "compute_jitter": 1})", "compute_jitter"},
        std::pair{R"({"workers": 2, "compute_ms": [1, 1], "worker_gbit": [1]})", "worker_gbit needs one entry"},
        std::pair{R"({"workers": 2, "compute_ms": [1, 1], "worker_gbit": [1, -2]})", "worker_gbit must not be negative"},
        std::pair{R"({"workers": 2, "compute_ms": [1, 1], "aggregator_gbit": -1})", "aggregator_gbit"},
        std::pair{R"({"workers": 2, "aggregators": 2, "aggregator_gbit": [1, -1]})",
                  "aggregator_gbit must not be negative"},
        std::pair{R"({"workers": 2, "aggregator_gbit": "10"})",
                  "aggregator_gbit: expected a number or an array of numbers"},
        std::pair{R"({"workers": 2, "aggregator_gbit": [10, true]})",
                  "aggregator_gbit: expected a number or an array of numbers"},
        std::pair{R"({"workers": 2, "aggregators": 3, "aggregator_gbit": [1, 2]})",
                  "aggregator_gbit: 2 entries, expected one per aggregator (3)"},
        std::pair{R"({"workers": 2, "aggregator_gbit": [1, 2]})",
                  "aggregator_gbit: 2 entries, expected one per aggregator (1)"},
        std::pair{R"({"workers": 2, "aggregators": "colocated", "aggregator_gbit": 10})",
                  "aggregator_gbit: not used with \"aggregators\": \"colocated\""},
        std::pair{R"({"workers": 2, "aggregators": 0})", "aggregators: expected an integer from 1 to 64"},
        std::pair{R"({"workers": 2, "aggregators": 65})", "aggregators: expected an integer from 1 to 64"},
        std::pair{R"({"workers": 2, "mtu": 1000})", "mtu must be 1280..9000"},
        std::pair{R"({"workers": 2, "mtu": 1500.5})", "mtu: expected an integer"},
        std::pair{R"({"workers": 2, "aggregators": 2.5})", "aggregators: expected an integer from 1 to 64"},
        std::pair{R"({"workers": 2, "aggregators": -1})", "aggregators: expected an integer from 1 to 64"},
        std::pair{R"({"workers": 2, "aggregators": true})", "aggregators: expected an integer from 1 to 64"},
        std::pair{R"({"workers": 2, "aggregators": "3"})", "aggregators: expected an integer from 1 to 64"},
        std::pair{R"({"workers": 2, "aggregators": "colocate"})",
                  "aggregators: expected an integer from 1 to 64, \"colocated\", \"routed\", \"two-level:L\" or "
                  "\"auto\""},
        std::pair{R"({"workers": 2, "aggregators": "auto", "aggregator_gbit": []})",
                  "aggregator_gbit: with \"aggregators\": \"auto\", expected a number (one host) or an array of 1 to 64"},
        std::pair{R"({"workers": 2, "aggregators": "auto", "aggregator_gbit": "10"})",
                  "aggregator_gbit: with \"aggregators\": \"auto\""},
        std::pair{R"({"workers": 2, "aggregators": "auto", "aggregator_gbit": [1, -1]})",
                  "aggregator_gbit must not be negative"},
        std::pair{R"({"workers": 251, "aggregators": "auto"})", "workers must be 2..250"},
        std::pair{R"({"workers": 2, "aggregators": "two-level:64"})", "two-level takes 1 to 63 leaves"},
        std::pair{R"({"workers": 65, "aggregators": 3})", "workers must be 2..64 (two-level layouts: more)"},
        std::pair{R"({"workers": 2, "compute_ms": [1, 1], "gradient_scale": 2})", "gradient_scale"},
        std::pair{R"({"workers": 2, "compute_ms": [1, 1], "bucket_mb": 0})", "bucket_mb"},
        std::pair{R"({"workers": 2, "compute_ms": [1, 1], "loss": 1})", "loss must be in [0, 1)"},
        std::pair{R"({"workers": 2, "compute_ms": [1, 1], "systems": []})", "systems is empty"},
        std::pair{R"({"workers": 2, "wire_bits": 8})", "wire_bits must be 32 or 16, not 8"},
        std::pair{R"({"workers": 2, "wire_bits": "16"})", "wire_bits: expected an integer"},
        std::pair{R"({"workers": 2, "wire_bits": 16.5})", "wire_bits: expected an integer"},
        std::pair{R"({"workers": 2, "competing_flows": {"from": "worker 0", "to": "aggregator 0"}})",
                  "competing_flows: expected an array of objects"},
        std::pair{R"({"workers": 2, "competing_flows": ["worker 0"]})", "competing_flows[0]: expected an object"},
        std::pair{R"({"workers": 2, "competing_flows": [{"from": "worker 0"}]})", "competing_flows[0]: to: missing"},
        std::pair{R"({"workers": 2, "competing_flows": [{"from": "worker 0", "to": "aggregator 0", "rate": 1}]})",
                  "competing_flows[0]: unknown field \"rate\""},
        std::pair{R"({"workers": 2, "competing_flows": [{"from": "worker0", "to": "aggregator 0"}]})",
                  "competing_flows[0]: from: \"worker0\": expected \"worker I\" or \"aggregator K\""},
        std::pair{R"({"workers": 2, "competing_flows": [{"from": "switch 0", "to": "aggregator 0"}]})",
                  "competing_flows[0]: from: \"switch 0\""},
        std::pair{R"({"workers": 2, "competing_flows": [{"from": "worker -1", "to": "aggregator 0"}]})",
                  "competing_flows[0]: from: \"worker -1\""},
        std::pair{R"({"workers": 2, "competing_flows": [{"from": 1, "to": "aggregator 0"}]})",
                  "competing_flows[0]: from: expected a string"},
        std::pair{R"({"workers": 2, "competing_flows": [{"from": "worker 2", "to": "aggregator 0"}]})",
                  "competing_flows[0]: worker 2: the testbed has 2 workers (0..1)"},
        std::pair{R"({"workers": 2, "competing_flows": [{"from": "worker 0", "to": "aggregator 1"}]})",
                  "competing_flows[0]: aggregator 1: the testbed has 1 aggregators (0..0)"},
        std::pair{R"({"workers": 2, "aggregators": 2,
                      "competing_flows": [{"from": "aggregator 1", "to": "aggregator 0"}]})",
                  "competing_flows[0]: dedicated aggregators cannot reach one another"},
        std::pair{R"({"workers": 2, "competing_flows": [{"from": "worker 1", "to": "worker 1"}]})",
                  "competing_flows[0]: from and to are both worker 1"},
        std::pair{R"({"workers": 2, "aggregators": "colocated",
                      "competing_flows": [{"from": "worker 1", "to": "aggregator 1"}]})",
                  "competing_flows[0]: worker 1 and aggregator 1 share host 1: the flow would cross no link"},
        std::pair{R"({"workers": 2, "worker_gbit": [1, 1], "ecn_marking": [{"link": "worker 1"}]})",
                  "ecn_marking[0]: threshold_kb: missing"},
        std::pair{R"({"workers": 2, "worker_gbit": [1, 1], "ecn_marking": [{"link": "worker 1", "threshold_kb": 0}]})",
                  "ecn_marking[0]: threshold_kb must be positive"},
        std::pair{R"({"workers": 2, "worker_gbit": [1, 1], "ecn_marking": [{"link": "worker 1", "threshold_kb": "8"}]})",
                  "ecn_marking[0]: threshold_kb: expected a number"},
        std::pair{R"({"workers": 2, "worker_gbit": [1, 1],
                      "ecn_marking": [{"link": "worker 1", "threshold_kb": 8, "rate_fraction": 1.5}]})",
                  "ecn_marking[0]: rate_fraction must be in (0, 1]"},
        std::pair{R"({"workers": 2, "worker_gbit": [1, 1], "ecn_marking": [{"link": "worker 1", "thresh": 8}]})",
                  "ecn_marking[0]: unknown field \"thresh\""},
        std::pair{R"({"workers": 2, "worker_gbit": [1, 1], "ecn_marking": [{"link": "worker 2", "threshold_kb": 8}]})",
                  "ecn_marking[0]: link: 2 workers (0..1)"},
        std::pair{R"({"workers": 2, "worker_gbit": [1, 1], "ecn_marking": [{"link": "aggregator 0", "threshold_kb": 8}]})",
                  "ecn_marking[0]: link: aggregator 0's link is not shaped (aggregator_gbit is 0)"},
        std::pair{R"({"workers": 2, "ecn_marking": [{"link": "worker 0", "threshold_kb": 8}]})",
                  "ecn_marking[0]: link: worker 0's link is not shaped (worker_gbit is 0)"},
        std::pair{R"({"workers": 2, "aggregators": "colocated", "worker_gbit": [1, 1],
                      "ecn_marking": [{"link": "aggregator 0", "threshold_kb": 8}]})",
                  "ecn_marking[0]: link: co-located aggregators have no link of their own"},
        std::pair{R"({"workers": 2, "worker_gbit": [1, 1], "ecn_marking": [{"link": "worker 1", "threshold_kb": 8},
                      {"link": "worker 1", "threshold_kb": 16}]})",
                  "ecn_marking[1]: worker 1 is already marked by entry 0"}));

}  // namespace
}  // namespace xagg::testbed
