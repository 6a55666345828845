// `xagg bench hetero` end to end on a small scenario: every system (XAgg, the
// switch-style baseline, TCP PS, Gloo) completes its iterations on a shaped
// testbed and reports positive times. Needs root, XDP on veth and tbf.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "process.h"
#include "testbed.h"

namespace xagg::testbed {
namespace {

namespace fs = std::filesystem;

TEST(HeteroBench, EverySystemCompletesOnAShapedTestbed) {
  ASSERT_EQ(geteuid(), 0) << "the testbed needs root (namespaces, XDP, tc)";
  fs::path dir = fs::temp_directory_path() / ("xhet-test-" + std::to_string(getpid()));
  fs::create_directories(dir / "scenarios");
  fs::create_directories(dir / "traces");
  // A two-tensor "model": 40 k and 8 k elements, in two buckets.
  std::ofstream(dir / "traces" / "tiny.json")
      << R"({"model":"tiny","tensors":[{"name":"a","elements":40000},{"name":"b","elements":8000}]})";
  std::ofstream(dir / "scenarios" / "tiny.json") << R"({"name":"tiny","workers":2,"model":"tiny","bucket_mb":0.1,
      "compute_ms":[5,10],"worker_gbit":[2,1],"aggregator_gbit":4})";
  Process bench({{XAGG_BINARY, "bench", "hetero", "--scenario", (dir / "scenarios" / "tiny.json").string(),
                  "--iterations", "2", "--rounds", "2", "--prefix", "xhet-t", "--json", (dir / "result.json").string(),
                  "--timeout-s", "60"},
                 std::nullopt, std::nullopt});
  ProcessResult result = bench.wait(Clock::now() + std::chrono::seconds(240));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  nlohmann::json json = nlohmann::json::parse(std::ifstream(dir / "result.json"));
  ASSERT_EQ(json.at("systems").size(), 4u);
  for (const auto& system : json.at("systems")) {
    // Two rounds of two timed iterations, taken in turn with the other systems.
    EXPECT_EQ(system.at("critical_ms").size(), 4u) << system.at("system");
    EXPECT_EQ(system.at("round"), nlohmann::json({1, 1, 2, 2})) << system.at("system");
    EXPECT_EQ(system.at("round_median_critical_ms").size(), 2u) << system.at("system");
    EXPECT_GT(system.at("median_iteration_ms").get<double>(), 0) << system.at("system");
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace xagg::testbed
