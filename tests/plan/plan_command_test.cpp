// `xagg plan` as a user runs it: its choice and the settings it prints on
// known clusters, from flags and from a scenario file, its JSON, and a
// non-zero exit naming the problem on bad input. Needs no root.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "process.h"

namespace xagg::testbed {
namespace {

namespace fs = std::filesystem;

ProcessResult plan(std::vector<std::string> arguments) {
  arguments.insert(arguments.begin(), {XAGG_BINARY, "plan"});
  Process command({arguments, std::nullopt, std::nullopt});
  return command.wait(Clock::now() + std::chrono::seconds(60));
}

// A 20 MB gradient in 2.5 MB buckets on four workers.
std::vector<std::string> four_workers(std::vector<std::string> more) {
  std::vector<std::string> arguments{"--workers", "4", "--gradient-mb", "20", "--bucket-mb", "2.5"};
  arguments.insert(arguments.end(), more.begin(), more.end());
  return arguments;
}

TEST(PlanCommand, OneFastAggregatorWithItsSettingsAndJson) {
  TempDirectory directory("xagg-test-plan");
  const fs::path json_file = directory.path() / "plan.json";
  const ProcessResult result = plan(four_workers({"--worker-gbit", "2", "--compute-ms", "100,150,200,300",
                                                  "--aggregator-gbit", "10", "--aggregator-addresses",
                                                  "198.18.0.1", "--json", json_file.string()}));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("Use 1 dedicated"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("xagg worker --aggregator 198.18.0.1 --world-size 4"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("XAGG_AGGREGATOR=198.18.0.1\n"), std::string::npos) << result.output;
  const nlohmann::json json = nlohmann::json::parse(std::ifstream(json_file));
  EXPECT_EQ(json.at("choice").at("aggregators"), "1");
  EXPECT_EQ(json.at("against_ring"), "faster");
  EXPECT_EQ(json.at("ring").at("aggregators"), "ring");
  EXPECT_EQ(json.at("layouts").size(), 2u);  // 1 dedicated, co-located
}

// Aggregators of different speeds share the job by their links; the
// printed settings list the faster first, with the weights.
TEST(PlanCommand, WeightsForAggregatorsOfDifferentSpeeds) {
  const ProcessResult result =
      plan(four_workers({"--worker-gbit", "8", "--aggregator-gbit", "10,20", "--aggregator-addresses",
                         "198.18.0.1,198.18.0.2"}));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("Use 2 dedicated"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("--aggregator 198.18.0.2,198.18.0.1 --aggregator-weights 1000,500"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("XAGG_AGGREGATOR=198.18.0.2,198.18.0.1 XAGG_AGGREGATOR_WEIGHTS=1000,500"),
            std::string::npos)
      << result.output;
}

TEST(PlanCommand, SaysPlainlyWhenNothingBeatsTheRing) {
  const ProcessResult result = plan(four_workers({"--worker-gbit", "2", "--aggregator-gbit", "2,2"}));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("No aggregator layout beats the ring here"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("Use colocated with XAgg"), std::string::npos) << result.output;
}

TEST(PlanCommand, PlansAScenarioFile) {
  TempDirectory directory("xagg-test-plan");
  fs::create_directories(directory.path() / "scenarios");
  fs::create_directories(directory.path() / "traces");
  std::ofstream(directory.path() / "traces" / "tiny.json")
      << R"({"model":"tiny","tensors":[{"name":"a","elements":4000000},{"name":"b","elements":1000000}]})";
  const fs::path file = directory.path() / "scenarios" / "tiny.json";
  std::ofstream(file) << R"({"workers": 4, "model": "tiny", "bucket_mb": 2.5, "compute_ms": [100, 100, 100, 100],
                            "worker_gbit": [2, 2, 2, 2], "aggregators": "auto", "aggregator_gbit": [1, 10]})";
  const fs::path json_file = directory.path() / "plan.json";
  const ProcessResult result = plan({"--scenario", file.string(), "--json", json_file.string()});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const nlohmann::json json = nlohmann::json::parse(std::ifstream(json_file));
  EXPECT_EQ(json.at("choice").at("aggregators"), "1");
  EXPECT_EQ(json.at("choice").at("hosts"), nlohmann::json({1}));
  EXPECT_NE(result.output.find("<aggregator host 1>"), std::string::npos) << result.output;
}

class BadPlanInput : public testing::TestWithParam<std::pair<std::vector<std::string>, std::string>> {};

TEST_P(BadPlanInput, ExitsNonZeroNamingTheProblem) {
  const auto& [arguments, expected] = GetParam();
  const ProcessResult result = plan(arguments);
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find(expected), std::string::npos) << result.output;
}

INSTANTIATE_TEST_SUITE_P(
    Inputs, BadPlanInput,
    testing::Values(
        std::pair{std::vector<std::string>{}, "--workers is needed without --scenario"},
        std::pair{std::vector<std::string>{"--workers", "4", "--worker-gbit", "2"}, "--gradient-mb must be a positive"},
        std::pair{four_workers({"--worker-gbit", "2,2"}), "--worker-gbit: 2 values for 4 workers"},
        std::pair{four_workers({"--worker-gbit", "2", "--compute-ms", "1,2,3"}), "--compute-ms: 3 values for 4"},
        std::pair{four_workers({"--worker-gbit", "2", "--aggregator-gbit=-1"}), "aggregator_gbit[0] is -1"},
        std::pair{std::vector<std::string>{"--workers", "4", "--worker-gbit", "2", "--gradient-mb", "20", "--bucket-mb",
                                           "0"},
                  "--bucket-mb must be a positive"},
        std::pair{four_workers({"--worker-gbit", "2", "--aggregator-gbit", "10,10", "--aggregator-addresses",
                                "198.18.0.1"}),
                  "--aggregator-addresses: 1 addresses for 2 aggregator hosts"},
        std::pair{std::vector<std::string>{"--workers", "1", "--worker-gbit", "2", "--gradient-mb", "20"},
                  "--workers"},
        std::pair{std::vector<std::string>{"--scenario", XAGG_SCENARIOS_DIR "/homogeneous.json", "--workers", "4"},
                  "excludes"},
        std::pair{std::vector<std::string>{"--scenario", "/nonexistent/scenario.json"}, "--scenario"}));

}  // namespace
}  // namespace xagg::testbed
