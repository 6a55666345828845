// Shared by the end-to-end tests: they create namespaces and load XDP, so root is required.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cluster.h"
#include "impairment.h"

namespace xagg::e2e {

// Fails (never skips): a suite that silently skips would hide a broken CI setup.
inline void require_root() {
  ASSERT_EQ(geteuid(), 0u) << "the end-to-end tests create network namespaces and attach XDP programs: run them as root";
}

// A fresh testbed and aggregator for every test; the aggregator's output is
// shown when the test failed, and everything is removed afterwards.
template <class Param>
class ClusterTest : public ::testing::TestWithParam<Param> {
 protected:
  void start(uint32_t workers, testbed::AggregatorKind kind = testbed::AggregatorKind::Xdp) {
    require_root();
    bed_.up(workers);
    cluster_.start_aggregator(xagg::Clock::now() + std::chrono::seconds(30), kind);
  }

  void TearDown() override {
    xagg::ProcessResult aggregator = cluster_.stop_aggregator();
    if (this->HasFailure()) std::cerr << "aggregator output:\n" << aggregator.output << "\n";
    bed_.down();
  }

  testbed::Testbed bed_{"xagg-e2e"};
  testbed::Cluster cluster_{XAGG_BINARY, bed_};
};

// Every rank's worker exited 0 before its deadline, and each of its
// `iterations` reports verified every element (see `xagg worker`).
inline void expect_every_element_verified(const std::vector<xagg::ProcessResult>& results, uint32_t iterations) {
  for (uint32_t rank = 0; rank < results.size(); ++rank) {
    const xagg::ProcessResult& result = results[rank];
    SCOPED_TRACE("rank " + std::to_string(rank) + " output:\n" + result.output);
    EXPECT_FALSE(result.timed_out);
    EXPECT_EQ(result.exit_code, 0);
    const auto reports = testbed::worker_reports(result.output);
    EXPECT_EQ(reports.size(), iterations);
    for (const auto& report : reports) {
      EXPECT_EQ(report.at("wrong").get<uint64_t>(), 0u) << report.dump();
      // A null ratio stands for an error where none is allowed (int32).
      EXPECT_TRUE(report.at("max_error_ratio").is_number()) << report.dump();
      if (report.at("max_error_ratio").is_number()) {
        EXPECT_LE(report.at("max_error_ratio").get<double>(), 1.0) << report.dump();
      }
    }
  }
}

using WallClock = std::chrono::system_clock;

// The wall-clock time of a worker's spdlog line ("[2026-12-06 04:40:00.123] ...").
inline std::optional<WallClock::time_point> log_time(const std::string& line) {
  std::tm fields{};
  int millis = 0;
  if (std::sscanf(line.c_str(), "[%d-%d-%d %d:%d:%d.%d]", &fields.tm_year, &fields.tm_mon, &fields.tm_mday,
                  &fields.tm_hour, &fields.tm_min, &fields.tm_sec, &millis) != 7)
    return std::nullopt;
  fields.tm_year -= 1900;
  fields.tm_mon -= 1;
  fields.tm_isdst = -1;
  return WallClock::from_time_t(std::mktime(&fields)) + std::chrono::milliseconds(millis);
}

// Lines of `output` that contain `text`.
inline std::vector<std::string> lines_with(const std::string& output, const std::string& text) {
  std::vector<std::string> found;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);)
    if (line.find(text) != std::string::npos) found.push_back(line);
  return found;
}

// A counter of job 1's final line "job 1 counters: a=1 b=2" in the aggregator's log; 0 when absent.
inline uint64_t final_counter(const std::string& log, const std::string& name) {
  std::smatch match;
  if (!std::regex_search(log, match, std::regex("job 1 counters:.*\\b" + name + "=([0-9]+)"))) return 0;
  return std::stoull(match[1]);
}

// Stops the cluster's servers once job 1 has ended there (its final counters
// logged: the last rank's leave may come late over a lossy path), after 10 s
// at most, and returns their output.
inline std::string stop_after_job_end(testbed::Cluster& cluster) {
  const auto patience = xagg::Clock::now() + std::chrono::seconds(10);
  while (cluster.aggregator_output().find("job 1 counters:") == std::string::npos && xagg::Clock::now() < patience)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return cluster.stop_aggregator().output;
}

// For tests that bring their testbed up themselves (layout, loss): a testbed
// under a prefix of their own and a cluster on it; the aggregators' output is
// shown when the test failed, and everything is removed afterwards.
template <class Base = ::testing::Test>
class OwnTestbedTest : public Base {
 protected:
  explicit OwnTestbedTest(const char* prefix) : bed_(prefix) {}

  // The testbed, with `loss` (0: none) on every link, and its aggregators with --results `results`.
  void start(uint32_t workers, const testbed::Layout& layout, double loss, const std::string& results,
             testbed::AggregatorKind kind = testbed::AggregatorKind::Xdp) {
    require_root();
    bed_.up(workers, layout);
    // The loss hits the heartbeats' TCP too; the default aggregator_dead_after copes (reliability.md section 10).
    if (loss > 0) loss_.emplace(bed_, workers, loss);
    cluster_.set_result_mode(results);
    cluster_.start_aggregator(xagg::Clock::now() + std::chrono::seconds(30), kind);
  }

  void TearDown() override {
    xagg::ProcessResult aggregators = cluster_.stop_aggregator();
    if (this->HasFailure()) std::cerr << "aggregator output:\n" << aggregators.output << "\n";
    loss_.reset();
    bed_.down();
  }

  testbed::Testbed bed_;
  testbed::Cluster cluster_{XAGG_BINARY, bed_};
  std::optional<testbed::Impairment> loss_;
};

}  // namespace xagg::e2e
