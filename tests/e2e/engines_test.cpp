// The systems the benchmarks compare, end to end on a real testbed: the
// daemon's user-space UDP engine (same wire protocol as XDP), the TCP
// parameter server behind `xagg worker --backend tcp-ps`, the switch-style
// slot pool (`xagg switch-aggregator`), and Gloo's ring between the workers
// (no aggregator); and the XDP daemon sending each result by XDP_TX rather
// than through the fan-out CPUs. Every worker verifies every element.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cluster.h"
#include "e2e_support.h"

namespace xagg::testbed {
namespace {

constexpr uint32_t kWorkers = 4;

std::string name_of(AggregatorKind kind) {
  if (kind == AggregatorKind::XdpTxResults) return "XdpTxResults";
  if (kind == AggregatorKind::Userspace) return "UserspaceEngine";
  if (kind == AggregatorKind::Switch) return "Switch";
  return kind == AggregatorKind::TcpPs ? "TcpPs" : "Gloo";
}

}  // namespace

// gtest prints parameters in test listings; without this it dumps the bytes.
void PrintTo(AggregatorKind kind, std::ostream* out) { *out << name_of(kind); }

namespace {

class EngineTest : public e2e::ClusterTest<AggregatorKind> {
 protected:
  void SetUp() override { start(kWorkers, GetParam()); }
};

TEST_P(EngineTest, EveryWorkerVerifiesEveryElement) {
  JobSpec job;
  job.workers = kWorkers;
  job.elements = 300000;  // 391 chunks, the last one partial
  job.iterations = 3;
  job.op = "average";
  auto results = cluster_.run_workers(job, Clock::now() + std::chrono::seconds(120));
  for (uint32_t rank = 0; rank < results.size(); ++rank) {
    SCOPED_TRACE(fmt::format("rank {} output:\n{}", rank, results[rank].output));
    EXPECT_FALSE(results[rank].timed_out);
    EXPECT_EQ(results[rank].exit_code, 0);
    auto reports = worker_reports(results[rank].output);
    ASSERT_EQ(reports.size(), job.iterations);
    for (const auto& report : reports) EXPECT_EQ(report.at("wrong").get<uint64_t>(), 0u) << report.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Systems, EngineTest, ::testing::Values(AggregatorKind::XdpTxResults, AggregatorKind::Userspace,
                                                                    AggregatorKind::TcpPs, AggregatorKind::Switch,
                                                                    AggregatorKind::Gloo),
                         [](const ::testing::TestParamInfo<AggregatorKind>& info) { return name_of(info.param); });

}  // namespace
}  // namespace xagg::testbed
