// `--aggregators auto` end to end: `xagg bench hetero` and `xagg testbed up`
// take the plan's layout, and the bench runs the TCP PS on the planned
// aggregator hosts at their planned rates (the servers go where XAgg's
// aggregators would; hetero_tests runs XAgg itself). Needs root (namespaces, tc).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "planner.h"
#include "process.h"
#include "testbed.h"

namespace xagg::testbed {
namespace {

namespace fs = std::filesystem;

// Two workers on 1 Gbit/s links and two hosts free to aggregate, at 0.5 and
// 4 Gbit/s: the slow one would carry both gradients at half a worker's rate,
// the fast one keeps up with the workers, so the plan takes it alone.
// `aggregators`: the scenario's layout, "auto" unless told.
void write_cluster(const fs::path& dir, const std::string& aggregators = R"("auto")") {
  fs::create_directories(dir / "scenarios");
  fs::create_directories(dir / "traces");
  std::ofstream(dir / "traces" / "tiny.json")
      << R"({"model":"tiny","tensors":[{"name":"a","elements":200000},{"name":"b","elements":50000}]})";
  std::ofstream(dir / "scenarios" / "tiny.json") << R"({"name":"tiny","workers":2,"model":"tiny","bucket_mb":0.5,
      "compute_ms":[5,10],"worker_gbit":[1,1],"aggregators":)" << aggregators << R"(,"aggregator_gbit":[0.5,4],
      "systems":["tcp-ps"]})";
}

// The bench's result file after a run of the tiny scenario with these extra arguments.
nlohmann::json run_bench(const fs::path& dir, std::vector<std::string> extra) {
  std::vector<std::string> argv{XAGG_BINARY,  "bench",  "hetero", "--scenario", (dir / "scenarios" / "tiny.json").string(),
                                "--iterations", "2", "--prefix", "xplan-b", "--json", (dir / "result.json").string(),
                                "--timeout-s", "60"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Process bench({argv, std::nullopt, std::nullopt});
  const ProcessResult result = bench.wait(Clock::now() + std::chrono::seconds(240));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("# aggregators auto"), std::string::npos) << result.output;
  EXPECT_TRUE(Testbed("xplan-b").existing_namespaces().empty());
  return nlohmann::json::parse(std::ifstream(dir / "result.json"));
}

TEST(AutoLayout, HeteroBenchRunsInThePlannedLayout) {
  ASSERT_EQ(geteuid(), 0) << "the testbed needs root (namespaces, tc)";
  TempDirectory dir("xplan-test");
  write_cluster(dir.path());
  const fs::path scenario = dir.path() / "scenarios" / "tiny.json";
  const plan::PlannedScenario expected = plan::plan_scenario_file(scenario);
  ASSERT_EQ(expected.scenario.layout.to_string(), "1");
  ASSERT_EQ(expected.scenario.aggregator_gbit, (std::vector<double>{4}));
  const nlohmann::json json = run_bench(dir.path(), {});
  EXPECT_EQ(json.at("aggregators"), "1");
  EXPECT_EQ(json.at("aggregator_gbit"), nlohmann::json({4.0}));
  EXPECT_EQ(json.at("aggregators_planned"), true);
  ASSERT_EQ(json.at("systems").size(), 1u);
  for (const auto& system : json.at("systems")) {
    EXPECT_EQ(system.at("critical_ms").size(), 2u) << system.at("system");
    EXPECT_GT(system.at("median_iteration_ms").get<double>(), 0) << system.at("system");
  }
}

// `--aggregators auto` plans among the hosts of a scenario written for a layout of its own.
TEST(AutoLayout, BenchOptionPlansAmongTheScenarioHosts) {
  ASSERT_EQ(geteuid(), 0) << "the testbed needs root (namespaces, tc)";
  TempDirectory dir("xplan-test");
  write_cluster(dir.path(), "2");
  const nlohmann::json json = run_bench(dir.path(), {"--aggregators", "auto"});
  EXPECT_EQ(json.at("aggregators"), "1");
  EXPECT_EQ(json.at("aggregator_gbit"), nlohmann::json({4.0}));
  EXPECT_EQ(json.at("aggregators_planned"), true);
}

TEST(AutoLayout, TestbedUpTakesThePlannedLayout) {
  ASSERT_EQ(geteuid(), 0) << "the testbed needs root (namespaces, tc)";
  TempDirectory dir("xplan-test");
  write_cluster(dir.path());
  Testbed bed("xplan-t");
  TeardownGuard teardown(bed);
  Process up({{XAGG_BINARY, "testbed", "up", "--aggregators", "auto", "--scenario",
               (dir.path() / "scenarios" / "tiny.json").string(), "--prefix", "xplan-t"},
              std::nullopt,
              std::nullopt});
  const ProcessResult result = up.wait(Clock::now() + std::chrono::seconds(120));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(bed.existing_workers(), 2u);
  ASSERT_TRUE(bed.existing_layout());
  EXPECT_EQ(bed.existing_layout()->to_string(), "1");
  // Without a cluster to plan for, auto is refused and nothing is built.
  Process refused({{XAGG_BINARY, "testbed", "up", "--aggregators", "auto", "--prefix", "xplan-r"},
                   std::nullopt,
                   std::nullopt});
  const ProcessResult refusal = refused.wait(Clock::now() + std::chrono::seconds(60));
  EXPECT_NE(refusal.exit_code, 0);
  EXPECT_NE(refusal.output.find("give --scenario FILE"), std::string::npos) << refusal.output;
  EXPECT_TRUE(Testbed("xplan-r").existing_namespaces().empty());
}

}  // namespace
}  // namespace xagg::testbed
