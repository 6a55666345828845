// `xagg demo`: brings up a testbed, runs the aggregator and N verifying workers
// all-reducing a ResNet-50-sized gradient, prints a per-iteration table and
// tears everything down again, also on failure or Ctrl-C.
#include <fmt/format.h>

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <sstream>

#include "cluster.h"
#include "commands.h"

namespace xagg::tools {
namespace {

volatile std::sig_atomic_t interrupted = 0;

// Turns Ctrl-C / SIGTERM into a flag the wait loop polls, so teardown still runs.
class InterruptFlag {
 public:
  InterruptFlag() {
    struct sigaction action {};
    action.sa_handler = [](int) { interrupted = 1; };
    sigaction(SIGINT, &action, &previous_int_);
    sigaction(SIGTERM, &action, &previous_term_);
  }
  ~InterruptFlag() {
    sigaction(SIGINT, &previous_int_, nullptr);
    sigaction(SIGTERM, &previous_term_, nullptr);
  }

 private:
  struct sigaction previous_int_ {};
  struct sigaction previous_term_ {};
};

struct DemoOptions {
  uint32_t workers = 4;
  uint64_t elements = 25557032;  // ResNet-50's parameter count
  uint32_t iterations = 10;
  uint32_t timeout_s = 900;
};

void print_table(const DemoOptions& options, const std::vector<xagg::ProcessResult>& results) {
  std::vector<std::vector<nlohmann::json>> reports;
  for (const auto& result : results) reports.push_back(testbed::worker_reports(result.output));

  fmt::print("\n{:>9} {:>12} {:>12} {:>14} {:>12}\n", "iteration", "time (ms)", "algbw GB/s", "max |error|",
             "error/bound");
  double worst_error = 0, worst_ratio = 0;
  for (uint32_t iteration = 0; iteration < options.iterations; ++iteration) {
    // An iteration lasts as long as its slowest worker.
    double seconds = 0, error = 0, ratio = 0;
    uint32_t reported = 0;
    for (const auto& worker : reports) {
      if (iteration >= worker.size()) continue;
      const auto& report = worker[iteration];
      seconds = std::max(seconds, report.at("seconds").get<double>());
      error = std::max(error, report.at("max_abs_error").get<double>());
      // JSON has no infinity: a null ratio means an error where none is allowed.
      const auto& report_ratio = report.at("max_error_ratio");
      ratio = std::max(ratio, report_ratio.is_number() ? report_ratio.get<double>() : INFINITY);
      ++reported;
    }
    if (reported < options.workers) {
      fmt::print("{:>9}   ({} of {} workers reported)\n", iteration, reported, options.workers);
      continue;
    }
    double algbw = double(options.elements * sizeof(float)) / seconds / 1e9;
    fmt::print("{:>9} {:>12.2f} {:>12.3f} {:>14.3e} {:>12.4f}\n", iteration, seconds * 1e3, algbw, error, ratio);
    worst_error = std::max(worst_error, error);
    worst_ratio = std::max(worst_ratio, ratio);
  }
  fmt::print("\nlargest error {:.3e}, {:.1f}% of the documented bound (per chunk: N*2^(e-31+ceil(log2 N)) "
             "plus float32 rounding)\n",
             worst_error, worst_ratio * 100);
}

int run_demo(const DemoOptions& options) {
  InterruptFlag interrupt_flag;
  testbed::Testbed bed(testbed::per_run_prefix("xdemo"));
  testbed::TeardownGuard teardown(bed);  // declared first: runs after the processes are gone
  bed.up(options.workers);

  testbed::Cluster cluster(std::filesystem::read_symlink("/proc/self/exe"), bed);
  cluster.start_aggregator(xagg::Clock::now() + std::chrono::seconds(30));
  spdlog::info("aggregator ready; {} workers all-reduce {} float32 x {} iterations", options.workers,
               options.elements, options.iterations);

  testbed::JobSpec job;
  job.workers = options.workers;
  job.elements = options.elements;
  job.iterations = options.iterations;
  auto results = cluster.run_workers(job, xagg::Clock::now() + std::chrono::seconds(options.timeout_s),
                                     [] { return interrupted != 0; });
  print_table(options, results);

  int failures = 0;
  for (size_t rank = 0; rank < results.size(); ++rank) {
    const auto& result = results[rank];
    if (result.exit_code == 0 && !result.timed_out) continue;
    ++failures;
    fmt::print("\nworker {} {}:\n{}\n", rank,
               result.timed_out ? "stopped (deadline or interrupt)" : fmt::format("failed ({})", result.exit_code),
               result.output);
  }
  auto aggregator = cluster.stop_aggregator();
  // The daemon logs a job's data-plane counters when the job ends.
  std::istringstream log(aggregator.output);
  for (std::string line; std::getline(log, line);)
    if (line.find(" counters:") != std::string::npos) fmt::print("\naggregator, {}\n", line.substr(line.find("job ")));
  if (interrupted) spdlog::warn("interrupted");
  if (failures > 0 || interrupted) {
    fmt::print("\naggregator output:\n{}\n", aggregator.output);
    return 1;
  }
  fmt::print("all {} workers verified every element\n", options.workers);
  return 0;
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto options = std::make_shared<DemoOptions>();
  auto* demo = app.add_subcommand("demo", "Run a verified all-reduce job on a fresh testbed of its own (prefix xdemo<pid>)");
  demo->add_option("--workers", options->workers)->check(CLI::Range(1, 64))->capture_default_str();
  demo->add_option("--elements", options->elements, "float32 elements per all-reduce")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  demo->add_option("--iterations", options->iterations)->check(CLI::PositiveNumber)->capture_default_str();
  demo->add_option("--timeout-s", options->timeout_s, "Deadline for all workers")->capture_default_str();
  demo->callback([options] {
    if (int rc = run_demo(*options); rc != 0) throw std::runtime_error("demo failed");
  });
}

}  // namespace xagg::tools
