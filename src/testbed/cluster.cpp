#include "cluster.h"

#include <fmt/format.h>

#include <sstream>

#include "wire.h"

namespace xagg::testbed {

Cluster::Cluster(std::filesystem::path xagg_binary, const Testbed& testbed)
    : binary_(std::move(xagg_binary)), testbed_(testbed) {}

void Cluster::start_aggregator(Clock::time_point deadline) {
  HostLink host = testbed_.aggregator();
  aggregator_.emplace(ProcessSpec{.argv = {binary_, "aggregator", "--interface", kHostInterface},
                                  .netns = host.netns,
                                  .output_file = std::nullopt});
  wait_for_tcp_port(host.netns, host.address, wire::kDefaultControlPort, *aggregator_, deadline);
}

ProcessResult Cluster::stop_aggregator() {
  if (!aggregator_) return {};
  ProcessResult result = aggregator_->terminate();
  aggregator_.reset();
  return result;
}

bool Cluster::aggregator_running() { return aggregator_ && !aggregator_->poll(); }

std::string Cluster::aggregator_stats() {
  Process stats(ProcessSpec{.argv = {binary_, "stats", "--interface", kHostInterface, "--count", "1"},
                            .netns = testbed_.aggregator().netns,
                            .output_file = std::nullopt});
  return stats.wait(Clock::now() + std::chrono::seconds(10)).output;
}

std::vector<ProcessResult> Cluster::run_workers(const JobSpec& job, Clock::time_point deadline,
                                                const std::function<bool()>& cancelled) {
  std::vector<Process> workers;
  for (uint32_t rank = 0; rank < job.workers; ++rank) {
    auto delay = job.start_delay_ms.find(rank);
    workers.emplace_back(ProcessSpec{
        .argv = {binary_, "worker", "--aggregator", testbed_.aggregator().address, "--job", std::to_string(job.job_id),
                 "--rank", std::to_string(rank), "--world-size", std::to_string(job.workers), "--elements",
                 std::to_string(job.elements), "--iterations", std::to_string(job.iterations), "--dtype", job.dtype,
                 "--op", job.op, "--seed", std::to_string(job.seed), "--start-delay-ms",
                 std::to_string(delay == job.start_delay_ms.end() ? 0 : delay->second), "--json"},
        .netns = testbed_.worker(rank).netns,
        .output_file = std::nullopt});
  }
  return wait_all(workers, deadline, cancelled);
}

std::vector<nlohmann::json> worker_reports(const std::string& output) {
  std::vector<nlohmann::json> reports;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    // Log lines share the stream; reports are the lines that are JSON objects.
    if (line.empty() || line.front() != '{') continue;
    auto report = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (report.is_object()) reports.push_back(std::move(report));
  }
  return reports;
}

}  // namespace xagg::testbed
