// Jobs on links of any MTU from the minimum up, through the real XDP data
// plane: the ranks agree on the smallest path MTU at join, the chunks fit it
// unfragmented, and every worker verifies every element, also under loss.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <optional>
#include <regex>

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

// The aggregator's cells follow the job's chunk size: the daemon reserves for
// a job at MTU 1500 about 360/2048 of a jumbo job's bytes per chunk, so a
// memory quota that fits the job only in cells of its size admits it, and the
// job verifies every element.
class CellMemoryTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (aggregator_ && HasFailure()) std::cerr << "aggregator output:\n" << aggregator_->output() << "\n";
    aggregator_.reset();
    bed_.down();
  }

  // (Re)starts the daemon; quota 0: its default.
  void start_aggregator(uint64_t quota) {
    aggregator_.reset();
    std::vector<std::string> argv{XAGG_BINARY, "aggregator", "--interface", kHostInterface};
    if (quota != 0) argv.insert(argv.end(), {"--memory-quota", std::to_string(quota)});
    aggregator_.emplace(ProcessSpec{.argv = argv, .netns = bed_.aggregator().netns, .output_file = std::nullopt});
    wait_for_tcp_port(bed_.aggregator().netns, kAggregatorAddress, wire::kDefaultControlPort, *aggregator_,
                      Clock::now() + std::chrono::seconds(30));
  }

  struct Reservation {
    uint64_t chunks = 0;
    uint64_t bytes = 0;
  };

  // Runs a one-rank job of kElements that joins with this MTU and verifies
  // every element; what the daemon reserved for it, from its start line.
  Reservation run_job(uint32_t job_id, uint32_t mtu) {
    Process worker({.argv = {XAGG_BINARY, "worker", "--aggregator", kAggregatorAddress, "--job",
                             std::to_string(job_id), "--rank", "0", "--world-size", "1", "--elements",
                             std::to_string(kElements), "--iterations", "2", "--dtype", "int32", "--mtu",
                             std::to_string(mtu), "--json"},
                    .netns = bed_.worker(0).netns,
                    .output_file = std::nullopt});
    ProcessResult result = worker.wait(Clock::now() + std::chrono::seconds(120));
    EXPECT_FALSE(result.timed_out) << result.output;
    EXPECT_EQ(result.exit_code, 0) << result.output;
    auto reports = worker_reports(result.output);
    EXPECT_EQ(reports.size(), 2u) << result.output;
    for (const auto& report : reports) EXPECT_EQ(report.at("wrong").get<uint64_t>(), 0u) << report.dump();
    std::smatch match;
    const std::string log = aggregator_->output();
    const std::regex started(fmt::format(
        R"(job {}: all 1 ranks joined, starting: MTU {}, (\d+) chunks of (\d+) elements, (\d+) bytes reserved)",
        job_id, mtu));
    if (!std::regex_search(log, match, started)) {
      ADD_FAILURE() << "no start line for job " << job_id << " in:\n" << log;
      return {};
    }
    const Reservation reservation{std::stoull(match[1]), std::stoull(match[3])};
    EXPECT_EQ(std::stoul(match[2]), wire::chunk_elements_for(mtu));
    EXPECT_EQ(reservation.bytes,
              wire::cell_bytes(static_cast<uint32_t>(reservation.chunks), wire::chunk_elements_for(mtu)));
    return reservation;
  }

  Testbed bed_{"xagg-cells"};
  std::optional<Process> aggregator_;
};

TEST_F(CellMemoryTest, JobAt1500ReservesCellsOfItsChunkSizeAndAQuotaOfThemAdmitsIt) {
  e2e::require_root();
  bed_.up(1);
  start_aggregator(0);
  const Reservation at_1500 = run_job(1, 1500);
  const Reservation at_9000 = run_job(2, 9000);
  std::cout << fmt::format("reserved: {} bytes for {} chunks at MTU 1500, {} bytes for {} chunks at MTU 9000\n",
                           at_1500.bytes, at_1500.chunks, at_9000.bytes, at_9000.chunks);
  ASSERT_GT(at_1500.chunks, 0u);
  ASSERT_GT(at_9000.chunks, 0u);
  // A chunk's cells at 1500 take about 360/2048 of a jumbo chunk's: the job
  // takes about the same memory at either MTU (5.7 times more before classes).
  const double per_chunk = (static_cast<double>(at_1500.bytes) / at_1500.chunks) /
                           (static_cast<double>(at_9000.bytes) / at_9000.chunks);
  EXPECT_NEAR(per_chunk, 360.0 / 2048.0, 0.02);
  EXPECT_LT(static_cast<double>(at_1500.bytes), 1.15 * static_cast<double>(at_9000.bytes));

  // A quota of exactly the job's cells at 1500, a fifth of what jumbo-sized
  // cells for those chunks would need, admits it.
  ASSERT_LT(at_1500.bytes, 2 * at_1500.chunks * sizeof(xagg_chunk) / 5);
  start_aggregator(at_1500.bytes);
  EXPECT_EQ(run_job(3, 1500).bytes, at_1500.bytes);
  EXPECT_FALSE(aggregator_->poll()) << "the aggregator exited";
}

}  // namespace
}  // namespace xagg::testbed
