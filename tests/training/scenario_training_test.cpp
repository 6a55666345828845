// Link-heterogeneous training: `xagg train --scenario` shapes the testbed's links
// with the code of `xagg bench hetero`, the job still learns, and the shaping was
// really on the workers' links while it ran (seen from outside and in the log).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "process.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using xagg::Clock;

constexpr double kChance = 10.0;  // percent: ten classes

// A small 2-worker scenario; the slow link is rank 1's.
const json kScenario = {{"name", "tiny-bandwidth"}, {"workers", 2},        {"compute_ms", {50, 100}},
                        {"worker_gbit", {1, 0.25}},   {"aggregator_gbit", 2}, {"loss", 0.0}};

// True when rank 1's eth0 has the scenario's tbf now (false also while its namespace does not exist).
bool slow_link_shaped() {
  try {
    return xagg::run_command({"ip", "netns", "exec", "xtrain-w1", "tc", "qdisc", "show", "dev", "eth0",
                                       "root"})
               .find("tbf") != std::string::npos;
  } catch (const xagg::CommandError&) {
    return false;
  }
}

class ScenarioTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_FAIL() << "the training tests need root (network namespaces, XDP)";
    fs::create_directories(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }

  fs::path directory_ = fs::temp_directory_path() / ("xtrain-scenario-test-" + std::to_string(getpid()));
};

TEST_F(ScenarioTraining, XaggLearnsOnShapedLinks) {
  const fs::path scenario = directory_ / "tiny-bandwidth.json", log = directory_ / "log.json";
  std::ofstream(scenario) << kScenario.dump();

  xagg::Process training({.argv = {XAGG_BINARY, "train", "--backend", "xagg", "--scenario", scenario.string(),
                                            "--epochs", "1", "--train-samples", "1280", "--test-samples", "1000",
                                            "--log", log.string(), "--prefix", "xtrain"},
                                   .netns = std::nullopt,
                                   .output_file = std::nullopt});
  bool seen_shaped = false;
  const auto deadline = Clock::now() + std::chrono::minutes(3);
  while (!training.poll() && Clock::now() < deadline) {
    seen_shaped = seen_shaped || slow_link_shaped();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  auto result = training.wait(deadline);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  json trained = json::parse(std::ifstream(log));

  EXPECT_TRUE(seen_shaped) << "no tbf on xtrain-w1's eth0 while the training ran";
  ASSERT_EQ(trained["epochs"].size(), 1u);
  EXPECT_GT(trained["epochs"][0]["test_accuracy"].get<double>(), 2 * kChance) << "the model did not learn";
  EXPECT_EQ(trained["workers"], 2);
  EXPECT_EQ(trained["config"]["compute_skew"], json({1.0, 2.0})) << "compute_ms 50/100 as factors of the fastest";

  // Both ends of each worker's link had the scenario's rate and carried the training: each
  // step sends the worker's gradient out on its eth0 and the result back on its bridge port
  // (at least half its fp32 size, whatever the wire encoding).
  const json& recorded = trained["scenario"];
  ASSERT_EQ(recorded["name"], "tiny-bandwidth");
  ASSERT_EQ(recorded["links"].size(), 2u);
  const double gradient_bytes =
      trained["start"]["parameters"].get<double>() * sizeof(float) * trained["start"]["steps_per_epoch"].get<double>();
  for (const json& link : recorded["links"]) {
    const double gbit = kScenario["worker_gbit"][link["rank"].get<size_t>()];
    for (const char* end : {"egress", "ingress"}) {
      SCOPED_TRACE(fmt::format("rank {} {}", link["rank"].dump(), end));
      EXPECT_EQ(link[end]["kind"].get<std::string>(), "tbf");
      EXPECT_NEAR(link[end]["rate_gbit"].get<double>(), gbit, gbit * 0.01);
      EXPECT_GE(link[end]["bytes"].get<double>(), gradient_bytes / 2);
    }
  }
}

}  // namespace
