// A job spread over several aggregators, dedicated or co-located with the
// workers, through the real XDP data plane: every worker verifies every
// element, also under loss on every link and with exponents that must be
// redone (random magnitudes).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <optional>

#include "cluster.h"
#include "e2e_support.h"
#include "impairment.h"

namespace xagg::testbed {
namespace {

struct ShardedCase {
  const char* name;
  const char* layout;  // Layout::parse
  JobSpec job;
  double loss = 0;
};

void PrintTo(const ShardedCase& c, std::ostream* out) { *out << c.name; }

class ShardedJobTest : public ::testing::TestWithParam<ShardedCase> {
 protected:
  void TearDown() override {
    ProcessResult aggregators = cluster_.stop_aggregator();
    if (HasFailure()) std::cerr << "aggregator output:\n" << aggregators.output << "\n";
    bed_.down();
  }
  Testbed bed_{"xagg-shard"};
  Cluster cluster_{XAGG_BINARY, bed_};
};

TEST_P(ShardedJobTest, EveryWorkerVerifiesEveryElement) {
  e2e::require_root();
  const ShardedCase& c = GetParam();
  bed_.up(c.job.workers, Layout::parse(c.layout));
  std::optional<Impairment> loss;
  if (c.loss > 0) loss.emplace(bed_, c.job.workers, c.loss);
  cluster_.start_aggregator(Clock::now() + std::chrono::seconds(30));
  auto results = cluster_.run_workers(c.job, Clock::now() + std::chrono::seconds(240));
  for (uint32_t rank = 0; rank < results.size(); ++rank) {
    const ProcessResult& result = results[rank];
    ASSERT_FALSE(result.timed_out) << "rank " << rank << ":\n" << result.output;
    ASSERT_EQ(result.exit_code, 0) << "rank " << rank << ":\n" << result.output;
    auto reports = worker_reports(result.output);
    ASSERT_EQ(reports.size(), c.job.iterations) << result.output;
    for (const auto& report : reports) EXPECT_EQ(report.at("wrong").get<uint64_t>(), 0u) << report.dump();
  }
  if (loss) {
    EXPECT_GT(loss->counters().dropped, 0u) << "the loss filters dropped nothing";
  }
}

JobSpec job(uint32_t workers, uint64_t elements, const char* dtype, const char* op, const char* magnitudes = "stable",
            std::vector<uint32_t> weights = {}) {
  JobSpec spec;
  spec.workers = workers;
  spec.elements = elements;
  spec.iterations = 3;
  spec.dtype = dtype;
  spec.op = op;
  spec.magnitudes = magnitudes;
  spec.aggregator_weights = std::move(weights);
  return spec;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ShardedJobTest,
    ::testing::Values(
        ShardedCase{"dedicated4_float32_average", "4", job(4, 1'000'003, "float32", "average")},
        ShardedCase{"dedicated2_weighted_3_1_random_magnitudes_loss1pct", "2",
                    job(3, 600'001, "float32", "sum", "random", {3, 1}), 0.01},
        ShardedCase{"colocated4_float32_sum", "colocated", job(4, 1'000'003, "float32", "sum")},
        ShardedCase{"colocated3_int32_loss1pct", "colocated", job(3, 500'000, "int32", "sum"), 0.01}),
    [](const ::testing::TestParamInfo<ShardedCase>& info) { return std::string(info.param.name); });

// `xagg worker` ranks on a dedicated two-aggregator testbed with these
// aggregator lists; returns each rank's result.
class ShardedFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    e2e::require_root();
    bed_.up(2, Layout{.aggregators = 2, .colocated = false});
    cluster_.start_aggregator(Clock::now() + std::chrono::seconds(30));
  }
  void TearDown() override {
    ProcessResult aggregators = cluster_.stop_aggregator();
    if (HasFailure()) std::cerr << "aggregator output:\n" << aggregators.output << "\n";
    bed_.down();
  }
  std::vector<Process> start_ranks(const std::vector<std::string>& lists, uint64_t elements, uint32_t iterations) {
    std::vector<Process> ranks;
    for (uint32_t rank = 0; rank < lists.size(); ++rank)
      ranks.emplace_back(ProcessSpec{.argv = {XAGG_BINARY, "worker", "--aggregator", lists[rank], "--job", "5",
                                              "--rank", std::to_string(rank), "--world-size",
                                              std::to_string(lists.size()), "--elements", std::to_string(elements),
                                              "--iterations", std::to_string(iterations)},
                                     .netns = bed_.worker(rank).netns,
                                     .output_file = std::nullopt});
    return ranks;
  }
  Testbed bed_{"xagg-shardf"};
  Cluster cluster_{XAGG_BINARY, bed_};
};

// Listed in another order, the aggregators would add different chunks of
// the job in one cell: the second rank's join is refused, naming the rule,
// and no rank completes.
TEST_F(ShardedFailureTest, RanksListingTheAggregatorsInAnotherOrderAreRefused) {
  const std::string a = bed_.aggregator(0).address, b = bed_.aggregator(1).address;
  auto ranks = start_ranks({a + "," + b, b + "," + a}, 100'000, 1);
  auto results = wait_all(ranks, Clock::now() + std::chrono::seconds(60));
  bool named = false;
  for (const ProcessResult& result : results) {
    EXPECT_FALSE(result.timed_out) << result.output;
    EXPECT_NE(result.exit_code, 0) << result.output;
    named = named || result.output.find("same order") != std::string::npos;
  }
  EXPECT_TRUE(named) << results[0].output << results[1].output;
}

}  // namespace
}  // namespace xagg::testbed
