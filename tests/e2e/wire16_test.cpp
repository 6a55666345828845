// The 16-bit wire (docs/protocol.md section 11) end to end: real namespaces,
// the real data planes and `xagg worker --wire-bits 16`, whose every element
// each rank checks against the 16-bit bound from a float64 reference; on
// jumbo links and at MTU 1500, under loss, through the user-space engine,
// over two aggregators, in two levels and as a reduce-scatter. The aggregator
// saw only 16-bit shares of the job (no op_mismatch) and the packets carried
// twice the elements. Beside it, Gloo's float16 all-reduce (`xagg worker
// --backend gloo --wire-bits 16`), the baseline the 16-bit wire is measured
// against, checked against the float64 reference within float16's bound.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <regex>
#include <thread>

#include "cluster.h"
#include "process.h"
#include "e2e_support.h"
#include "wire.h"

namespace xagg::testbed {
namespace {

struct Wire16Case {
  const char* name;
  const char* layout;  // Layout::parse
  uint32_t mtu = kLinkMtu;
  uint32_t workers = 4;
  const char* op = "sum";
  const char* collective = "allreduce";
  const char* magnitudes = "stable";
  double loss = 0;
  AggregatorKind kind = AggregatorKind::Xdp;
  const char* results = "auto";
};

void PrintTo(const Wire16Case& c, std::ostream* out) { *out << c.name; }

class Wire16Test : public e2e::OwnTestbedTest<::testing::TestWithParam<Wire16Case>> {
 protected:
  Wire16Test() : OwnTestbedTest("xagg-w16") {}
};

TEST_P(Wire16Test, EveryElementWithinTheSixteenBitBound) {
  const Wire16Case& c = GetParam();
  e2e::require_root();
  bed_.up(c.workers, Layout::parse(c.layout), c.mtu);
  if (c.loss > 0) loss_.emplace(bed_, c.workers, c.loss);
  cluster_.set_result_mode(c.results);
  cluster_.start_aggregator(Clock::now() + std::chrono::seconds(30), c.kind);
  JobSpec job;
  job.workers = c.workers;
  job.elements = uint64_t{c.workers} * 50'021;  // several chunks per rank's shard, the last one short
  job.op = c.op;
  job.collective = c.collective;
  job.magnitudes = c.magnitudes;
  job.iterations = 3;
  job.wire_bits = 16;
  const auto results = cluster_.run_workers(job, Clock::now() + std::chrono::seconds(240));
  e2e::expect_every_element_verified(results, job.iterations);
  const std::string agreed =
      fmt::format("MTU {}, {} elements per chunk", c.mtu, wire::chunk_elements_for(c.mtu, wire::kNarrowBits));
  for (const ProcessResult& result : results) EXPECT_NE(result.output.find(agreed), std::string::npos) << result.output;
  if (loss_) {
    EXPECT_GT(loss_->counters().dropped, 0u) << "the loss filters dropped nothing";
  }
  ASSERT_TRUE(cluster_.aggregator_running()) << "the aggregator exited during the job";
  const std::string log = cluster_.stop_aggregator().output;
  EXPECT_FALSE(std::regex_search(log, std::regex("(op|length)_mismatch=[1-9]"))) << log;
}

INSTANTIATE_TEST_SUITE_P(
    Wire16, Wire16Test,
    ::testing::Values(Wire16Case{"xdp_jumbo_average", "1", kLinkMtu, 4, "average"},
                      Wire16Case{"xdp_mtu1500_random_magnitudes_loss1pct", "1", 1500, 4, "sum", "allreduce", "random",
                                 0.01},
                      Wire16Case{"userspace_engine_mtu1500", "1", 1500, 3, "sum", "allreduce", "stable", 0,
                                 AggregatorKind::Userspace},
                      Wire16Case{"userspace_engine_reduce_scatter_random_magnitudes_loss1pct", "1", kLinkMtu, 4,
                                 "average", "reduce-scatter", "random", 0.01, AggregatorKind::Userspace},
                      Wire16Case{"two_aggregators_loss1pct", "2", kLinkMtu, 4, "sum", "allreduce", "stable", 0.01},
                      Wire16Case{"two_levels_uneven_leaves_loss1pct", "two-level:3", kLinkMtu, 7, "average",
                                 "allreduce", "stable", 0.01},
                      Wire16Case{"reduce_scatter_routed_unicast_loss1pct", "routed", 1500, 4, "sum", "reduce-scatter",
                                 "stable", 0.01, AggregatorKind::Xdp, "unicast"}),
    [](const ::testing::TestParamInfo<Wire16Case>& info) { return std::string(info.param.name); });

// Failover on the 16-bit wire: one of three aggregators killed while the job
// runs; its chunks move to the survivors (16-bit cells there too) and every
// rank still verifies every element of every all-reduce.
class Wire16FailoverTest : public e2e::OwnTestbedTest<> {
 protected:
  Wire16FailoverTest() : OwnTestbedTest("xagg-w16f") {}
};

TEST_F(Wire16FailoverTest, AnAggregatorKilledMidJobEveryElementWithinTheBound) {
  constexpr uint32_t kWorkers = 3, kIterations = 40;
  start(kWorkers, Layout{.aggregators = 3, .colocated = false}, 0, "auto");
  std::vector<std::string> addresses;
  for (uint32_t k = 0; k < 3; ++k) addresses.push_back(bed_.aggregator(k).address);
  std::vector<Process> ranks;
  for (uint32_t rank = 0; rank < kWorkers; ++rank)
    ranks.emplace_back(ProcessSpec{.argv = {XAGG_BINARY, "worker", "--aggregator", fmt::format("{}", fmt::join(addresses, ",")),
                                            "--job", "1", "--rank", std::to_string(rank), "--world-size",
                                            std::to_string(kWorkers), "--elements", "200000", "--iterations",
                                            std::to_string(kIterations), "--wire-bits", "16", "--json"},
                                   .netns = bed_.worker(rank).netns,
                                   .output_file = std::nullopt});
  const auto running_by = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < running_by &&
         !std::ranges::all_of(ranks, [](const Process& rank) { return worker_reports(rank.output()).size() >= 2; }))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(::kill(cluster_.aggregator_pids().at(1), SIGKILL), 0);
  const auto results = wait_all(ranks, Clock::now() + std::chrono::seconds(120));
  e2e::expect_every_element_verified(results, kIterations);
  bool moved = false;
  for (const ProcessResult& result : results) moved = moved || result.output.find("failover to epoch") != std::string::npos;
  EXPECT_TRUE(moved) << "no rank failed over: the kill came after the job";
}

// Gloo's ring over float16, as DDP's fp16_compress_hook runs it: every rank
// checks every element within float16's bound (inputs and every partial sum
// rounded to float16), which is far wider than float32's: the results did
// travel as float16, and no wider bound lets them pass.
class GlooFloat16Test : public e2e::OwnTestbedTest<::testing::TestWithParam<const char*>> {
 protected:
  GlooFloat16Test() : OwnTestbedTest("xagg-g16") {}
};

TEST_P(GlooFloat16Test, EveryElementWithinTheFloat16Bound) {
  constexpr uint32_t kWorkers = 4;
  start(kWorkers, Layout{}, 0, "auto", AggregatorKind::Gloo);
  JobSpec job;
  job.workers = kWorkers;
  job.elements = 300'001;  // the ring's pieces uneven
  job.op = GetParam();
  job.iterations = 3;
  job.wire_bits = 16;
  const auto results = cluster_.run_workers(job, Clock::now() + std::chrono::seconds(120));
  e2e::expect_every_element_verified(results, job.iterations);
  // float16 rounding shows: values up to 2^12 (4 ranks) leave errors of whole units, where
  // float32's N-1 additions would stay below 3 x 2^-24 x 4 x 2^12 < 0.01.
  double largest_error = 0;
  for (const ProcessResult& result : results)
    for (const auto& report : worker_reports(result.output))
      largest_error = std::max(largest_error, report.at("max_abs_error").get<double>());
  EXPECT_GT(largest_error, 0.1) << "no float16 rounding: did the values travel as float32?";
}

INSTANTIATE_TEST_SUITE_P(Ops, GlooFloat16Test, ::testing::Values("sum", "average"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
}  // namespace xagg::testbed
