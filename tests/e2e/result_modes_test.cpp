// Results beyond one segment, through the real XDP data plane: each result
// mode (broadcast, multicast, unicast fan-out) on the routed layout (workers on
// two subnets behind a router) and on one segment, with every element
// verified by every worker, also under loss so that resends and tail probes
// cross the router; and a clear refusal for a mode that cannot reach a rank.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cluster.h"
#include "e2e_support.h"

namespace xagg::testbed {
namespace {

struct ModeCase {
  const char* name;
  const char* layout;    // Layout::parse
  const char* results;   // the daemon's --results
  const char* expected;  // the mode the aggregator must pick
  JobSpec job;
  double loss = 0;
  // XdpTxResults: results leave from the CPU that completed the chunk, not through the fan-out CPU's cpumap.
  AggregatorKind kind = AggregatorKind::Xdp;
};

void PrintTo(const ModeCase& c, std::ostream* out) { *out << c.name; }

JobSpec job(uint32_t workers, const char* dtype, const char* op = "sum") {
  JobSpec spec;
  spec.workers = workers;
  spec.elements = (1u << 20) + 77;  // a partial last chunk
  spec.dtype = dtype;
  spec.op = op;
  spec.iterations = 3;
  return spec;
}

constexpr const char* kPrefix = "xagg-modes";

class ResultModesTest : public e2e::OwnTestbedTest<::testing::TestWithParam<ModeCase>> {
 protected:
  ResultModesTest() : OwnTestbedTest(kPrefix) {}
};

TEST_P(ResultModesTest, EveryRankVerifiesEveryElement) {
  const ModeCase& c = GetParam();
  start(c.job.workers, Layout::parse(c.layout), c.loss, c.results, c.kind);
  e2e::expect_every_element_verified(cluster_.run_workers(c.job, Clock::now() + std::chrono::seconds(240)),
                                     c.job.iterations);
  if (loss_) {
    EXPECT_GT(loss_->counters().dropped, 0u) << "the loss filters dropped nothing";
  }
  ASSERT_TRUE(cluster_.aggregator_running()) << "the aggregator exited during the job";
  const std::string log = e2e::stop_after_job_end(cluster_);
  EXPECT_NE(log.find(fmt::format("results by {}", c.expected)), std::string::npos) << log;
  const uint64_t completed = e2e::final_counter(log, "completed");
  EXPECT_GT(completed, 0u) << log;
  // The fan-out sends one copy per rank of every completed chunk, and only for unicast jobs. It counts
  // the clones the kernel took: one that a full backlog refused (a burst on 2 cores) is missing, and
  // its rank got the chunk by a resend instead, so the resends make up for every missing copy.
  const uint64_t expected_copies = std::string(c.expected) == "unicast" ? completed * c.job.workers : 0;
  const uint64_t copies = e2e::final_counter(log, "unicast_copies");
  const uint64_t resent = e2e::final_counter(log, "resent");
  EXPECT_LE(copies, expected_copies) << log;
  EXPECT_GE(copies + resent, expected_copies) << log;
  if (expected_copies > 0) {
    EXPECT_GT(copies, expected_copies * 9 / 10) << log;
  }
  if (loss_) {
    EXPECT_GT(resent, 0u) << "no RESULT was resent under loss:\n" << log;
  } else {
    // A rank the mode does not reach (a subnet the group is not routed to) still finishes, on a resend per
    // chunk: the first send must reach every rank.
    EXPECT_LT(resent, completed / 2) << "ranks missed the results' first send:\n" << log;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, ResultModesTest,
    ::testing::Values(ModeCase{"routed_unicast", "routed", "unicast", "unicast", job(4, "float32")},
                      ModeCase{"routed_auto_picks_unicast", "routed", "auto", "unicast", job(3, "int32")},
                      ModeCase{"routed_unicast_without_fan_out_cpus", "routed", "unicast", "unicast", job(4, "float32"),
                               0, AggregatorKind::XdpTxResults},
                      ModeCase{"routed_multicast", "routed", "multicast", "multicast", job(4, "float32")},
                      ModeCase{"routed_unicast_loss", "routed", "unicast", "unicast", job(4, "int32", "average"), 0.01},
                      ModeCase{"routed_multicast_loss", "routed", "multicast", "multicast", job(4, "float32"), 0.01},
                      ModeCase{"segment_auto_picks_broadcast", "1", "auto", "broadcast", job(4, "float32")},
                      ModeCase{"segment_multicast", "1", "multicast", "multicast", job(4, "int32")},
                      ModeCase{"segment_unicast_loss", "1", "unicast", "unicast", job(3, "float32"), 0.01}),
    [](const ::testing::TestParamInfo<ModeCase>& info) { return std::string(info.param.name); });

// Broadcast asked for where a rank sits behind the router: that rank's join is
// refused with a message that names the problem and the way out.
class ResultModeRefusalTest : public e2e::OwnTestbedTest<> {
 protected:
  ResultModeRefusalTest() : OwnTestbedTest(kPrefix) {}
};

TEST_F(ResultModeRefusalTest, BroadcastToARankOffTheSubnetIsRefusedAtJoin) {
  start(2, Layout::parse("routed"), 0, "broadcast");
  JobSpec spec = job(2, "float32");
  // Rank 0 (subnet A) waits for rank 1, whose join is refused: the deadline ends rank 0.
  auto results = cluster_.run_workers(spec, Clock::now() + std::chrono::seconds(20));
  const ProcessResult& off_subnet = results.at(1);
  EXPECT_FALSE(off_subnet.timed_out) << off_subnet.output;
  EXPECT_NE(off_subnet.exit_code, 0) << off_subnet.output;
  EXPECT_NE(off_subnet.output.find("off this aggregator's subnet"), std::string::npos) << off_subnet.output;
  EXPECT_NE(off_subnet.output.find("--results unicast, multicast or auto"), std::string::npos) << off_subnet.output;
  EXPECT_TRUE(results.at(0).timed_out || results.at(0).exit_code != 0)
      << "rank 0 finished a job whose rank 1 was refused:\n" << results.at(0).output;
}

}  // namespace
}  // namespace xagg::testbed
