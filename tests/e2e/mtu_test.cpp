// Jobs on links of any MTU from the minimum up, through the real XDP data
// plane: the ranks agree on the smallest path MTU at join, the chunks fit it
// unfragmented, and every worker verifies every element, also under loss.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <optional>

#include "cluster.h"
#include "e2e_support.h"
#include "impairment.h"
#include "wire.h"

namespace xagg::testbed {
namespace {

struct MtuCase {
  const char* name;
  uint32_t mtu;         // every link's
  const char* layout;   // Layout::parse
  JobSpec job;
  double loss = 0;
  uint32_t worker0_mtu = 0;  // non-zero: worker 0's own interface only, below the others
};

void PrintTo(const MtuCase& c, std::ostream* out) { *out << c.name; }

JobSpec job(uint32_t workers, uint64_t elements, const char* dtype, const char* op = "sum") {
  JobSpec spec;
  spec.workers = workers;
  spec.elements = elements;
  spec.dtype = dtype;
  spec.op = op;
  spec.iterations = 3;
  return spec;
}

class MtuTest : public ::testing::TestWithParam<MtuCase> {
 protected:
  void TearDown() override {
    ProcessResult aggregators = cluster_.stop_aggregator();
    if (HasFailure()) std::cerr << "aggregator output:\n" << aggregators.output << "\n";
    bed_.down();
  }
  Testbed bed_{"xagg-mtu"};
  Cluster cluster_{XAGG_BINARY, bed_};
};

TEST_P(MtuTest, RanksAgreeOnTheSmallestMtuAndVerifyEveryElement) {
  e2e::require_root();
  const MtuCase& c = GetParam();
  bed_.up(c.job.workers, Layout::parse(c.layout), c.mtu);
  if (c.worker0_mtu != 0)
    run_command({"ip", "-n", bed_.worker(0).netns, "link", "set", "dev", kHostInterface, "mtu",
                 std::to_string(c.worker0_mtu)});
  std::optional<Impairment> loss;
  if (c.loss > 0) loss.emplace(bed_, c.job.workers, c.loss);
  cluster_.start_aggregator(Clock::now() + std::chrono::seconds(30));
  auto results = cluster_.run_workers(c.job, Clock::now() + std::chrono::seconds(240));
  const uint32_t job_mtu = c.worker0_mtu != 0 ? c.worker0_mtu : c.mtu;
  const std::string agreed =
      fmt::format("MTU {}, {} elements per chunk", job_mtu, wire::chunk_elements_for(job_mtu));
  for (uint32_t rank = 0; rank < results.size(); ++rank) {
    const ProcessResult& result = results[rank];
    ASSERT_FALSE(result.timed_out) << "rank " << rank << ":\n" << result.output;
    ASSERT_EQ(result.exit_code, 0) << "rank " << rank << ":\n" << result.output;
    EXPECT_NE(result.output.find(agreed), std::string::npos) << "rank " << rank << ", expected " << agreed << ":\n"
                                                              << result.output;
    auto reports = worker_reports(result.output);
    ASSERT_EQ(reports.size(), c.job.iterations) << result.output;
    for (const auto& report : reports) {
      EXPECT_EQ(report.at("wrong").get<uint64_t>(), 0u) << report.dump();
      ASSERT_TRUE(report.at("max_error_ratio").is_number()) << report.dump();
      EXPECT_LE(report.at("max_error_ratio").get<double>(), 1.0) << report.dump();
    }
  }
  if (loss) {
    EXPECT_GT(loss->counters().dropped, 0u) << "the loss filters dropped nothing";
  }
  EXPECT_TRUE(cluster_.aggregator_running()) << "the aggregator exited during the job";
}

constexpr uint64_t kElements = (1u << 20) + 77;  // a partial last chunk at every chunk size

INSTANTIATE_TEST_SUITE_P(
    Mtus, MtuTest,
    ::testing::Values(MtuCase{"mtu1500_float32", 1500, "1", job(4, kElements, "float32")},
                      MtuCase{"mtu1500_int32_average_loss", 1500, "1", job(4, kElements, "int32", "average"), 0.005},
                      MtuCase{"mtu4000_float32", 4000, "1", job(4, kElements, "float32")},
                      MtuCase{"mtu4000_int32_two_aggregators", 4000, "2", job(4, kElements, "int32")},
                      MtuCase{"mtu9000_float32_loss", 9000, "1", job(4, kElements, "float32"), 0.005},
                      MtuCase{"mtu1500_float32_colocated", 1500, "colocated", job(3, kElements, "float32")},
                      MtuCase{"mtu9000_worker0_at_1500", 9000, "1", job(3, kElements, "float32"), 0, 1500}),
    [](const ::testing::TestParamInfo<MtuCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace xagg::testbed
