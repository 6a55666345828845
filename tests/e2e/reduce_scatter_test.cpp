// Reduce-scatter through the real data planes (docs/protocol.md section 10):
// each rank verifies every element of its own shard, in every result mode,
// under loss (a non-owner's resend is answered with the values, unused), and
// through the user-space engine; the aggregator sent the other ranks each
// chunk's header alone, counted as scatter_headers.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cluster.h"
#include "e2e_support.h"

namespace xagg::testbed {
namespace {

struct ScatterCase {
  const char* name;
  const char* layout;   // Layout::parse
  const char* results;  // the daemon's --results
  uint32_t workers;
  const char* dtype;
  double loss = 0;
  AggregatorKind kind = AggregatorKind::Xdp;
};

void PrintTo(const ScatterCase& c, std::ostream* out) { *out << c.name; }

class ReduceScatterTest : public e2e::OwnTestbedTest<::testing::TestWithParam<ScatterCase>> {
 protected:
  ReduceScatterTest() : OwnTestbedTest("xagg-rs") {}
};

TEST_P(ReduceScatterTest, EveryRankVerifiesItsShard) {
  const ScatterCase& c = GetParam();
  start(c.workers, Layout::parse(c.layout), c.loss, c.results, c.kind);
  JobSpec job;
  job.workers = c.workers;
  job.elements = uint64_t{c.workers} * 100'003;  // shards of several chunks, the last one short
  job.dtype = c.dtype;
  job.collective = "reduce-scatter";
  job.iterations = 3;
  e2e::expect_every_element_verified(cluster_.run_workers(job, Clock::now() + std::chrono::seconds(240)),
                                     job.iterations);
  if (loss_) {
    EXPECT_GT(loss_->counters().dropped, 0u) << "the loss filters dropped nothing";
  }
  ASSERT_TRUE(cluster_.aggregator_running()) << "the aggregator exited during the job";
  const std::string log = e2e::stop_after_job_end(cluster_);
  const uint64_t completed = e2e::final_counter(log, "completed");
  const uint64_t headers = e2e::final_counter(log, "scatter_headers");
  // Every rank's share of every data chunk went out with SCATTER; a chunk's
  // header goes to each of the other ranks by XDP (a clone a full backlog
  // refused is made up by a resend), once by broadcast from user space.
  EXPECT_GT(headers, 0u) << log;
  const uint64_t per_chunk = c.kind == AggregatorKind::Userspace ? 1 : c.workers - 1;
  EXPECT_LE(headers, completed * per_chunk) << log;
  EXPECT_EQ(e2e::final_counter(log, "op_mismatch"), 0u) << log;
  if (loss_) {
    EXPECT_GT(e2e::final_counter(log, "resent"), 0u) << "no RESULT was resent under loss:\n" << log;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Scatter, ReduceScatterTest,
    ::testing::Values(ScatterCase{"segment_broadcast_float", "1", "auto", 4, "float32"},
                      ScatterCase{"segment_broadcast_int32_loss1pct", "1", "broadcast", 3, "int32", 0.01},
                      ScatterCase{"routed_unicast_float_loss1pct", "routed", "unicast", 4, "float32", 0.01},
                      ScatterCase{"routed_multicast_int32", "routed", "multicast", 4, "int32"},
                      ScatterCase{"userspace_engine_float", "1", "auto", 3, "float32", 0, AggregatorKind::Userspace}),
    [](const ::testing::TestParamInfo<ScatterCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace xagg::testbed
