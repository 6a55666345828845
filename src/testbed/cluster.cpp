#include "cluster.h"

#include <fmt/format.h>

#include <sstream>

#include "wire.h"

namespace xagg::testbed {

Cluster::Cluster(std::filesystem::path xagg_binary, const Testbed& testbed)
    : binary_(std::move(xagg_binary)), testbed_(testbed) {}

namespace {

constexpr uint16_t kTcpPsPort = 9990;
constexpr uint16_t kSwitchControlPort = 9990;  // `xagg switch-aggregator`'s default

uint16_t service_port(AggregatorKind kind) {
  if (kind == AggregatorKind::TcpPs) return kTcpPsPort;
  if (kind == AggregatorKind::Switch) return kSwitchControlPort;
  return wire::kDefaultControlPort;
}

// Both XAgg engines speak the XAgg protocol.
std::string backend_of(AggregatorKind kind) {
  if (kind == AggregatorKind::TcpPs) return "tcp-ps";
  if (kind == AggregatorKind::Switch) return "switch";
  if (kind == AggregatorKind::Gloo) return "gloo";
  return "xagg";
}

}  // namespace

void Cluster::start_aggregator(Clock::time_point deadline, AggregatorKind kind) {
  kind_ = kind;
  if (kind == AggregatorKind::Gloo) return;
  HostLink host = testbed_.aggregator();
  std::vector<std::string> argv{binary_, "aggregator", "--interface", kHostInterface, "--engine",
                                kind == AggregatorKind::Userspace ? "userspace" : "xdp"};
  if (kind == AggregatorKind::XdpTxResults) argv.push_back("--no-result-fan-out");
  if (kind == AggregatorKind::TcpPs)
    argv = {binary_, "tcp-ps-server", "--bind", host.address, "--port", std::to_string(kTcpPsPort)};
  if (kind == AggregatorKind::Switch)
    argv = {binary_, "switch-aggregator", "--interface", kHostInterface, "--control-port",
            std::to_string(kSwitchControlPort)};
  aggregator_.emplace(ProcessSpec{.argv = std::move(argv), .netns = host.netns, .output_file = std::nullopt});
  wait_for_tcp_port(host.netns, host.address, service_port(kind), *aggregator_, deadline);
}

ProcessResult Cluster::stop_aggregator() {
  if (!aggregator_) return {};
  ProcessResult result = aggregator_->terminate();
  aggregator_.reset();
  return result;
}

bool Cluster::aggregator_running() { return aggregator_ && !aggregator_->poll(); }

std::vector<ProcessResult> Cluster::run_workers(const JobSpec& job, Clock::time_point deadline,
                                                const std::function<bool()>& cancelled) {
  std::optional<TempDirectory> rendezvous;
  if (kind_ == AggregatorKind::Gloo) rendezvous.emplace(testbed_.prefix() + "-gloo");
  std::vector<Process> workers;
  for (uint32_t rank = 0; rank < job.workers; ++rank) {
    auto delay = job.start_delay_ms.find(rank);
    HostLink host = testbed_.worker(rank);
    std::vector<std::string> argv{
        binary_, "worker", "--backend", backend_of(kind_), "--aggregator", testbed_.aggregator().address,
        "--control-port", std::to_string(service_port(kind_)), "--job", std::to_string(job.job_id), "--rank",
        std::to_string(rank), "--world-size", std::to_string(job.workers), "--elements", std::to_string(job.elements),
        "--iterations", std::to_string(job.iterations), "--dtype", job.dtype, "--op", job.op, "--seed",
        std::to_string(job.seed), "--magnitudes", job.magnitudes, "--start-delay-ms",
        std::to_string(delay == job.start_delay_ms.end() ? 0 : delay->second), "--json"};
    if (rendezvous)
      argv.insert(argv.end(), {"--rendezvous", rendezvous->path().string(), "--local-address", host.address});
    workers.emplace_back(ProcessSpec{.argv = std::move(argv), .netns = host.netns, .output_file = std::nullopt});
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
