// Runs `xagg bench capacity` briefly and checks what it reports: positive
// rates, and XDP counters showing that every frame took the add or the
// completion path (not the cheaper duplicate path).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "process.h"

namespace {

constexpr const char* kNetns = "xcap-test";

TEST(CapacityBench, ReportsRatesAndTheAddPath) {
  ASSERT_EQ(geteuid(), 0u) << "the capacity bench loads XDP programs and creates a namespace: run as root";
  const auto json = std::filesystem::temp_directory_path() / fmt::format("xcap-test-{}.json", getpid());
  xagg::run_command({XAGG_BINARY, "bench", "capacity", "--seconds", "1", "--gradient-mib", "16",
                              "--memory-mib", "64", "--netns", kNetns, "--json", json.string()},
                             std::chrono::seconds(180));
  EXPECT_FALSE(std::filesystem::exists(fmt::format("/run/netns/{}", kNetns)));
  nlohmann::json report = nlohmann::json::parse(std::ifstream(json));
  std::filesystem::remove(json);
  const uint64_t world_size = report.at("world_size");

  std::set<std::string> systems;
  for (const auto& result : report.at("results")) {
    SCOPED_TRACE(result.dump());
    systems.insert(result.at("system"));
    EXPECT_GT(result.at("gbps").get<double>(), 0);
    EXPECT_GT(result.at("gbps_per_core").get<double>(), 0);
    if (result.at("system") != "xdp" || result.at("setup").get<std::string>().starts_with("feeder alone")) continue;
    const auto& checks = result.at("checks");
    const uint64_t frames = checks.at("frames"), completed = checks.at("completed");
    EXPECT_TRUE(checks.at("add_path").get<bool>());
    EXPECT_EQ(checks.at("aggregated").get<uint64_t>() + completed, frames);
    EXPECT_EQ(checks.at("other_outcomes").get<uint64_t>(), 0u);
    if (!result.at("setup").get<std::string>().starts_with("ranks interleaved")) continue;
    // One completion per world_size frames; each core may stop inside a chunk.
    const uint64_t cores = result.at("cores");
    EXPECT_LE(completed * world_size, frames);
    EXPECT_GT(completed * world_size + cores * world_size, frames);
  }
  EXPECT_EQ(systems, (std::set<std::string>{"xdp", "tcp-ps", "memory"}));
  EXPECT_EQ(report.at("scaling").size(), 4u);
}

}  // namespace
