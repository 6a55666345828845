// All-reduce through the real aggregator on a fresh testbed: every worker
// verifies every element against a float64 reference (see `xagg worker`).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cluster.h"
#include "e2e_support.h"

namespace xagg::testbed {
namespace {

constexpr uint32_t kTestbedWorkers = 4;  // cases with fewer ranks use w0..
constexpr uint64_t kMi = 1u << 20;

struct Case {
  JobSpec job;
  std::chrono::seconds timeout{120};
};

std::string describe(const Case& c) {
  const JobSpec& job = c.job;
  std::string name = fmt::format("w{}_n{}_{}_{}_i{}", job.workers, job.elements, job.dtype, job.op, job.iterations);
  if (job.magnitudes != "stable") name += "_" + job.magnitudes + "_magnitudes";
  for (const auto& [rank, delay] : job.start_delay_ms) name += fmt::format("_rank{}late{}ms", rank, delay);
  return name;
}
std::string case_name(const ::testing::TestParamInfo<Case>& info) { return describe(info.param); }
// gtest prints parameters in test listings; without this it dumps the bytes.
void PrintTo(const Case& c, std::ostream* out) { *out << describe(c); }

Case make_case(uint32_t workers, uint64_t elements, std::string dtype, std::string op = "sum", uint32_t iterations = 3) {
  Case c;
  c.job.workers = workers;
  c.job.elements = elements;
  c.job.dtype = std::move(dtype);
  c.job.op = std::move(op);
  c.job.iterations = iterations;
  return c;
}

class AllreduceTest : public e2e::ClusterTest<Case> {
 protected:
  void SetUp() override { start(kTestbedWorkers); }
};

TEST_P(AllreduceTest, EveryWorkerVerifiesEveryElement) {
  const Case& c = GetParam();
  auto results = cluster_.run_workers(c.job, Clock::now() + c.timeout);
  for (uint32_t rank = 0; rank < results.size(); ++rank) {
    const ProcessResult& result = results[rank];
    SCOPED_TRACE(fmt::format("rank {} output:\n{}", rank, result.output));
    EXPECT_FALSE(result.timed_out) << "worker did not finish within " << c.timeout.count() << " s";
    EXPECT_EQ(result.exit_code, 0);
    auto reports = worker_reports(result.output);
    ASSERT_EQ(reports.size(), c.job.iterations);
    for (const auto& report : reports) {
      EXPECT_EQ(report.at("wrong").get<uint64_t>(), 0u) << report.dump();
      // A null ratio stands for an error where none is allowed (int32).
      ASSERT_TRUE(report.at("max_error_ratio").is_number()) << report.dump();
      EXPECT_LE(report.at("max_error_ratio").get<double>(), 1.0) << report.dump();
    }
  }
  EXPECT_TRUE(cluster_.aggregator_running()) << "the aggregator exited during the job";
}

std::vector<Case> sum_cases(const std::string& dtype) {
  std::vector<Case> cases;
  for (uint32_t workers : {2u, 4u})
    for (uint64_t elements : {uint64_t{1}, uint64_t{255}, uint64_t{256}, uint64_t{257}, kMi})
      cases.push_back(make_case(workers, elements, dtype));
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Float32Sum, AllreduceTest, ::testing::ValuesIn(sum_cases("float32")), case_name);
INSTANTIATE_TEST_SUITE_P(Int32Sum, AllreduceTest, ::testing::ValuesIn(sum_cases("int32")), case_name);

std::vector<Case> large_cases() {
  std::vector<Case> cases;
  for (uint32_t workers : {2u, 4u}) {
    Case c = make_case(workers, 64 * kMi, "float32", "sum", 1);
    c.timeout = std::chrono::seconds(600);
    cases.push_back(c);
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Large, AllreduceTest, ::testing::ValuesIn(large_cases()), case_name);

INSTANTIATE_TEST_SUITE_P(Average, AllreduceTest,
                         ::testing::Values(make_case(4, kMi, "float32", "average"),
                                           make_case(4, 257, "int32", "average"),
                                           make_case(2, kMi, "int32", "average")),
                         case_name);

// Many all-reduces back to back, each with new values. With random
// magnitudes every float32 chunk's predicted exponent fails and is redone.
Case random_magnitudes_case() {
  Case c = make_case(4, 100000, "float32", "sum", 20);
  c.job.magnitudes = "random";
  return c;
}
INSTANTIATE_TEST_SUITE_P(BackToBack, AllreduceTest,
                         ::testing::Values(make_case(4, 100000, "float32", "sum", 20), random_magnitudes_case(),
                                           make_case(2, 100000, "int32", "sum", 20)),
                         case_name);

Case late_worker_case() {
  Case c = make_case(4, kMi, "float32", "sum", 2);
  c.job.start_delay_ms[3] = 2000;
  return c;
}
INSTANTIATE_TEST_SUITE_P(LateWorker, AllreduceTest, ::testing::Values(late_worker_case()), case_name);

}  // namespace
}  // namespace xagg::testbed
