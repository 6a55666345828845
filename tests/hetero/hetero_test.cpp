// `xagg bench hetero` end to end on a small scenario: every system (XAgg, the
// switch-style baseline, TCP PS, Gloo) completes its iterations on a shaped
// testbed and reports positive times. Needs root, XDP on veth and tbf.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <fmt/format.h>

#include "process.h"
#include "testbed.h"

namespace xagg::testbed {
namespace {

namespace fs = std::filesystem;

// A bench's files in `dir`: the model's trace as traces/<model>.json beside the
// scenario, which the bench finds there; returns the scenario's path.
fs::path write_scenario(const fs::path& dir, const std::string& model, uint64_t first_tensor_elements,
                        const std::string& scenario_name, const std::string& scenario_json) {
  fs::create_directories(dir / "scenarios");
  fs::create_directories(dir / "traces");
  std::ofstream(dir / "traces" / (model + ".json"))
      << fmt::format(R"({{"model":"{}","tensors":[{{"name":"a","elements":{}}},{{"name":"b","elements":8000}}]}})",
                     model, first_tensor_elements);
  const fs::path scenario = dir / "scenarios" / (scenario_name + ".json");
  std::ofstream(scenario) << scenario_json;
  return scenario;
}

TEST(HeteroBench, EverySystemCompletesOnAShapedTestbed) {
  ASSERT_EQ(geteuid(), 0) << "the testbed needs root (namespaces, XDP, tc)";
  fs::path dir = fs::temp_directory_path() / ("xhet-test-" + std::to_string(getpid()));
  // A two-tensor "model": 40 k and 8 k elements, in two buckets, over two
  // aggregators (the switch baselines use the first). Rank 1's
  // 0.1 Gbit/s link makes the link bound positive: it must receive 192 kB
  // (less tbf's 64 kB bucket) after both ranks' first buckets, 10.1 ms, which
  // ends 4.5 ms after its 10 ms of compute.
  const fs::path scenario = write_scenario(dir, "tiny", 40000, "tiny", R"({"name":"tiny","workers":2,"model":"tiny",
      "bucket_mb":0.1,"compute_ms":[5,10],"worker_gbit":[2,0.1],"aggregators":2,"aggregator_gbit":4})");
  Process bench({{XAGG_BINARY, "bench", "hetero", "--scenario", scenario.string(), "--iterations", "2", "--rounds", "2",
                  "--prefix", "xhet-t", "--json", (dir / "result.json").string(), "--plots", (dir / "plots").string(),
                  "--timeout-s", "60"},
                 std::nullopt,
                 std::nullopt});
  ProcessResult result = bench.wait(Clock::now() + std::chrono::seconds(240));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  nlohmann::json json = nlohmann::json::parse(std::ifstream(dir / "result.json"));
  ASSERT_EQ(json.at("systems").size(), 5u);  // xagg, switch, switch-jumbo, tcp-ps, gloo
  EXPECT_EQ(json.at("aggregators"), "2");
  for (const auto& system : json.at("systems")) {
    // Two rounds of two timed iterations, taken in turn with the other systems.
    EXPECT_EQ(system.at("critical_ms").size(), 4u) << system.at("system");
    EXPECT_EQ(system.at("round"), nlohmann::json({1, 1, 2, 2})) << system.at("system");
    EXPECT_EQ(system.at("round_median_critical_ms").size(), 2u) << system.at("system");
    EXPECT_GT(system.at("median_iteration_ms").get<double>(), 0) << system.at("system");
    // No system beats the physics of its links. The ready times behind the
    // bound are read in user space, which a loaded 2-core machine can
    // deschedule for a few hundred microseconds; allow that much.
    const auto critical = system.at("critical_ms").get<std::vector<double>>();
    const auto bound = system.at("link_bound_ms").get<std::vector<double>>();
    ASSERT_EQ(bound.size(), critical.size()) << system.at("system");
    for (size_t i = 0; i < bound.size(); ++i) {
      EXPECT_GT(bound[i], 1.0) << system.at("system") << " iteration " << i;
      EXPECT_GE(critical[i], 0.95 * bound[i] - 0.5) << system.at("system") << " iteration " << i;
    }
  }
  for (const char* plot : {"tiny-bars.png", "tiny-cdf.png"})
    EXPECT_GT(fs::exists(dir / "plots" / plot) ? fs::file_size(dir / "plots" / plot) : 0, 10000u) << plot;
  fs::remove_all(dir);
}

// A scenario's "wire_bits": 16 runs every system that has a 16-bit variant as
// that variant (xagg16, gloo16: Gloo's float16 all-reduce) and the others as
// they are; the 16-bit systems' link bounds count 2 bytes per element, and
// each is set beside the others in the output.
TEST(HeteroBench, ScenarioWireBitsRunTheSixteenBitVariants) {
  ASSERT_EQ(geteuid(), 0) << "the testbed needs root (namespaces, XDP, tc)";
  TempDirectory dir("xhet-w16-test");
  // Rank 1's 0.1 Gbit/s link needs tens of ms for 408 k elements even at 2 bytes each.
  const fs::path scenario = write_scenario(dir.path(), "tiny", 400000, "tiny16", R"({"name":"tiny16","workers":2,
      "model":"tiny","bucket_mb":0.4,"compute_ms":[5,10],"worker_gbit":[2,0.1],"aggregator_gbit":4,"wire_bits":16,
      "systems":["xagg","gloo","tcp-ps"]})");
  Process bench({{XAGG_BINARY, "bench", "hetero", "--scenario", scenario.string(), "--iterations", "2", "--prefix",
                  per_run_prefix("xhetw"), "--json", (dir.path() / "result.json").string(), "--timeout-s", "60"},
                 std::nullopt,
                 std::nullopt});
  ProcessResult result = bench.wait(Clock::now() + std::chrono::seconds(240));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("# xagg16 median critical path: "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("x gloo16's"), std::string::npos) << result.output;
  nlohmann::json json = nlohmann::json::parse(std::ifstream(dir.path() / "result.json"));
  const auto& systems = json.at("systems");
  ASSERT_EQ(systems.size(), 3u);
  const std::pair<const char*, uint32_t> expected[] = {{"xagg16", 16}, {"gloo16", 16}, {"tcp-ps", 32}};
  for (size_t i = 0; i < systems.size(); ++i) {
    EXPECT_EQ(systems[i].at("system"), expected[i].first);
    EXPECT_EQ(systems[i].at("wire_bits"), expected[i].second) << expected[i].first;
    const auto critical = systems[i].at("critical_ms").get<std::vector<double>>();
    const auto bound = systems[i].at("link_bound_ms").get<std::vector<double>>();
    ASSERT_EQ(bound.size(), critical.size()) << expected[i].first;
    for (size_t k = 0; k < bound.size(); ++k) {
      EXPECT_GT(bound[k], 10.0) << expected[i].first << " iteration " << k;
      EXPECT_GE(critical[k], 0.95 * bound[k] - 0.5) << expected[i].first << " iteration " << k;
    }
  }
}

// A scenario's competing flow and ECN marker are started with the testbed and
// reported beside every system: the flow's goodput during each system's timed
// iterations, its whole-run figures, the marker's counters; none of the
// systems sends ECT, so nothing may be marked.
TEST(HeteroBench, CompetingFlowAndMarkerAreReportedBesideEverySystem) {
  ASSERT_EQ(geteuid(), 0) << "the testbed needs root (namespaces, XDP, tc)";
  TempDirectory dir("xhet-flow-test");
  const fs::path scenario = write_scenario(dir.path(), "tiny", 400000, "flow", R"({"name":"flow","workers":2,
      "model":"tiny","compute_ms":[20,20],"worker_gbit":[0.5,0.5],"aggregator_gbit":0.5,"systems":["xagg","tcp-ps"],
      "competing_flows":[{"from":"worker 1","to":"aggregator 0"}],
      "ecn_marking":[{"link":"aggregator 0","threshold_kb":64}]})");
  Process bench({{XAGG_BINARY, "bench", "hetero", "--scenario", scenario.string(), "--iterations", "5", "--prefix",
                  per_run_prefix("xhetc"), "--json", (dir.path() / "result.json").string(), "--timeout-s", "60"},
                 std::nullopt,
                 std::nullopt});
  ProcessResult result = bench.wait(Clock::now() + std::chrono::seconds(240));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("competing Gbit/s"), std::string::npos) << result.output;
  nlohmann::json json = nlohmann::json::parse(std::ifstream(dir.path() / "result.json"));
  for (const auto& system : json.at("systems")) {
    const auto gbit = system.at("competing_flow_gbit").get<std::vector<double>>();
    ASSERT_EQ(gbit.size(), 1u) << system.at("system");
    EXPECT_GT(gbit[0], 0.05) << system.at("system") << ": the flow starved";
    EXPECT_LT(gbit[0], 0.5 * 1.05) << system.at("system") << ": more than the link";
  }
  const auto& flow = json.at("competing_flows").at(0);
  EXPECT_EQ(flow.at("flow"), "worker 1 -> aggregator 0");
  EXPECT_EQ(flow.at("error"), "");
  EXPECT_GT(flow.at("gbit").get<double>(), 0.05);
  const auto& marking = json.at("ecn_marking").at(0);
  EXPECT_EQ(marking.at("link"), "aggregator 0");
  EXPECT_GT(marking.at("to_host").at("frames").get<uint64_t>(), 1000u);
  // XAgg's DATA is ECT(0) and the flow fills the aggregator's link: the marker marks some of it.
  EXPECT_GT(marking.at("to_host").at("marked").get<uint64_t>(), 0u);
  EXPECT_LE(marking.at("to_host").at("marked").get<uint64_t>(), marking.at("to_host").at("frames").get<uint64_t>());
}

// A bench whose reader goes away (`xagg bench ... | head`) is not killed by
// SIGPIPE halfway with its testbed left in place: its write fails, and it
// unwinds and removes its namespaces like any failing run.
TEST(HeteroBench, AReaderThatGoesAwayLeavesNoTestbedBehind) {
  ASSERT_EQ(geteuid(), 0) << "the testbed needs root (namespaces, XDP, tc)";
  TempDirectory dir("xhet-pipe-test");
  const fs::path scenario = write_scenario(dir.path(), "tiny", 40000, "tiny", R"({"name":"tiny","workers":2,
      "model":"tiny","bucket_mb":0.1,"compute_ms":[5,10],"worker_gbit":[2,2],"aggregator_gbit":4})");
  // Line-buffered, the bench writes its first line once the testbed is up; head has gone by its second.
  Process piped({{"bash", "-c",
                  "stdbuf -oL \"$0\" bench hetero --scenario \"$1\" --systems xagg --iterations 50 --prefix "
                  "xhet-pipe | head -c 1 >/dev/null; echo \"bench exit code: ${PIPESTATUS[0]}\"",
                  XAGG_BINARY, scenario.string()},
                 std::nullopt,
                 std::nullopt});
  ProcessResult result = piped.wait(Clock::now() + std::chrono::seconds(120));
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_NE(result.output.find("bench exit code: "), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("bench exit code: 141"), std::string::npos) << "killed by SIGPIPE:\n" << result.output;
  EXPECT_EQ(run_command({"ip", "netns", "list"}).find("xhet-pipe"), std::string::npos)
      << "the bench left its namespaces:\n"
      << result.output;
  Testbed("xhet-pipe").down();
}

}  // namespace
}  // namespace xagg::testbed
