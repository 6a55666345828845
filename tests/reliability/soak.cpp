// The soak run behind scripts/soak.sh (not in CI): jobs of verifying workers
// on a testbed with random loss on every link, one worker killed with SIGKILL
// every few minutes (which aborts its job; a new job with every rank, the
// killed one restarted, follows at once). Prints all-reduces, wrong results,
// timeouts and the aggregator's memory at start and end; exits 1 on any wrong
// result, unexplained failure or aggregator death.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <future>
#include <random>
#include <thread>

#include "cluster.h"
#include "impairment.h"
#include "reliability_support.h"

using namespace xagg;
using namespace std::chrono_literals;
using xagg::Clock;

namespace {

struct Options {
  double duration_s = 3600;
  uint32_t workers = 4;
  double loss = 0.01;
  double kill_every_s = 180;
  uint64_t elements = 200000;
};

struct Tally {
  uint64_t jobs = 0, allreduces = 0, wrong = 0, timeouts = 0, kills = 0, unexplained = 0;
};

struct Memory {
  uint64_t resident_kb = 0;
  uint64_t map_bytes = 0;
};

Memory aggregator_memory(const testbed::Testbed& bed, testbed::Cluster& cluster) {
  return {reliability::resident_kb(cluster.aggregator_pid()), reliability::aggregator_objects(bed).map_bytes};
}

// Adds one job's worker results; `victim` is the rank killed on purpose, if any.
void tally_job(const std::vector<xagg::ProcessResult>& results, std::optional<uint32_t> victim, uint32_t job_id,
               Tally& tally) {
  uint64_t completed = UINT64_MAX;
  for (uint32_t rank = 0; rank < results.size(); ++rank) {
    const auto& result = results[rank];
    auto reports = testbed::worker_reports(result.output);
    for (const auto& report : reports) tally.wrong += report.at("wrong").get<uint64_t>();
    if (rank == victim) continue;
    completed = std::min<uint64_t>(completed, reports.size());
    bool timed_out = result.output.find("timed out") != std::string::npos;
    tally.timeouts += timed_out;
    bool expected_abort = victim && result.output.find(fmt::format("rank {} disconnected", *victim)) != std::string::npos;
    if (result.exit_code != 0 && !expected_abort && !timed_out) {
      ++tally.unexplained;
      spdlog::error("job {} rank {} failed (exit {}):\n{}", job_id, rank, result.exit_code, result.output);
    }
  }
  tally.allreduces += completed == UINT64_MAX ? 0 : completed;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"XAgg soak: loss, worker kills and restarts; counts wrong results"};
  // scripts/soak.sh passes the defaults first; the caller's values come later and win.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--duration-s", options.duration_s)->capture_default_str();
  app.add_option("--workers", options.workers)->check(CLI::Range(2, 16))->capture_default_str();
  app.add_option("--loss", options.loss, "Loss rate on every link, both directions")->capture_default_str();
  app.add_option("--kill-every-s", options.kill_every_s)->capture_default_str();
  app.add_option("--elements", options.elements, "float32 elements per all-reduce")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  testbed::Testbed bed("xrel-soak");
  testbed::TeardownGuard teardown(bed);
  bed.up(options.workers);
  testbed::Impairment loss(bed, options.workers, options.loss);
  testbed::Cluster cluster(XAGG_BINARY, bed);
  cluster.start_aggregator(Clock::now() + 30s);
  Memory start = aggregator_memory(bed, cluster);

  std::mt19937 random(std::random_device{}());
  Tally tally;
  bool aggregator_died = false;
  auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.duration_s));
  auto kill_every = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.kill_every_s));
  for (uint32_t job_id = 1; Clock::now() < end && !aggregator_died; ++job_id) {
    testbed::JobSpec job;  // runs until its worker is killed
    job.workers = options.workers;
    job.elements = options.elements;
    job.iterations = 1000000000;
    job.job_id = job_id;
    job.seed = job_id;
    auto workers = std::async(std::launch::async, [&] { return cluster.run_workers(job, Clock::now() + kill_every + 120s); });
    auto kill_at = std::min(end, Clock::now() + kill_every);
    std::optional<uint32_t> victim;
    if (workers.wait_until(kill_at) == std::future_status::timeout) {
      victim = std::uniform_int_distribution<uint32_t>(0, options.workers - 1)(random);
      if (auto pid = reliability::find_child({"--job", std::to_string(job_id), "--rank", std::to_string(*victim)})) {
        kill(*pid, SIGKILL);
        ++tally.kills;
      }
    }
    tally_job(workers.get(), victim, job_id, tally);
    ++tally.jobs;
    aggregator_died = !cluster.aggregator_running();
    spdlog::info("job {} done: {} all-reduces, {} wrong, {} timeouts, {} unexplained so far", job_id, tally.allreduces,
                 tally.wrong, tally.timeouts, tally.unexplained);
  }
  Memory finish = aggregator_memory(bed, cluster);
  testbed::LossCounters dropped = loss.counters();
  nlohmann::json summary{{"duration_s", options.duration_s}, {"workers", options.workers}, {"loss", options.loss},
                         {"measured_loss", dropped.rate()}, {"frames", dropped.seen}, {"jobs", tally.jobs},
                         {"worker_kills", tally.kills}, {"allreduces", tally.allreduces}, {"wrong", tally.wrong},
                         {"timeouts", tally.timeouts}, {"unexplained_failures", tally.unexplained},
                         {"aggregator_died", aggregator_died},
                         {"aggregator_rss_kb", {{"start", start.resident_kb}, {"end", finish.resident_kb}}},
                         {"aggregator_map_bytes", {{"start", start.map_bytes}, {"end", finish.map_bytes}}}};
  fmt::print("{}\n", summary.dump());
  fmt::print("all-reduces {}  wrong {}  timeouts {}  kills {}  aggregator RSS {} kB -> {} kB, maps {} B -> {} B\n",
             tally.allreduces, tally.wrong, tally.timeouts, tally.kills, start.resident_kb, finish.resident_kb,
             start.map_bytes, finish.map_bytes);
  cluster.stop_aggregator();
  return tally.wrong == 0 && tally.unexplained == 0 && !aggregator_died ? 0 : 1;
}
