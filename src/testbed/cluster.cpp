#include "cluster.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "wire.h"

namespace xagg::testbed {

// Both XAgg engines speak the XAgg protocol.
std::string backend_of(AggregatorKind kind) {
  if (kind == AggregatorKind::TcpPs) return "tcp-ps";
  if (kind == AggregatorKind::Switch) return "switch";
  if (kind == AggregatorKind::SwitchJumbo) return "switch-jumbo";
  if (kind == AggregatorKind::Gloo) return "gloo";
  return "xagg";
}

Cluster::Cluster(std::filesystem::path xagg_binary, const Testbed& testbed)
    : binary_(std::move(xagg_binary)), testbed_(testbed) {}

namespace {

constexpr uint16_t kTcpPsPort = 9990;
constexpr uint16_t kSwitchControlPort = 9990;  // `xagg switch-aggregator`'s default

bool is_switch(AggregatorKind kind) { return kind == AggregatorKind::Switch || kind == AggregatorKind::SwitchJumbo; }

uint16_t service_port(AggregatorKind kind) {
  if (kind == AggregatorKind::TcpPs) return kTcpPsPort;
  if (is_switch(kind)) return kSwitchControlPort;
  return wire::kDefaultControlPort;
}

std::vector<std::string> server_argv(const std::filesystem::path& binary, AggregatorKind kind, const HostLink& host,
                                     const std::string& result_mode) {
  if (kind == AggregatorKind::TcpPs)
    return {binary, "tcp-ps-server", "--bind", host.address, "--port", std::to_string(kTcpPsPort)};
  // One daemon serves both pool shapes: the workers ask for theirs at join.
  if (is_switch(kind))
    return {binary, "switch-aggregator", "--interface", host.interface, "--control-port",
            std::to_string(kSwitchControlPort)};
  // With /metrics on its own address, as an operator would scrape it.
  std::vector<std::string> argv{binary,   "aggregator", "--interface", host.interface, "--engine",
                                kind == AggregatorKind::Userspace ? "userspace" : "xdp", "--metrics", host.address};
  if (kind == AggregatorKind::XdpTxResults) argv.push_back("--no-result-fan-out");
  argv.insert(argv.end(), {"--results", result_mode});
  if (result_mode == "multicast") argv.insert(argv.end(), {"--multicast-group", kMulticastGroupBase});
  return argv;
}

// One server's output as it is; several, each under a line naming it.
std::string concatenated(const std::vector<std::string>& outputs) {
  if (outputs.size() == 1) return outputs.front();
  std::string text;
  for (size_t k = 0; k < outputs.size(); ++k) text += fmt::format("--- aggregator {} ---\n{}", k, outputs[k]);
  return text;
}

}  // namespace

std::vector<HostLink> Cluster::server_hosts() const {
  if (is_switch(kind_)) return {testbed_.aggregator(0)};  // it models one switch
  std::vector<HostLink> hosts;
  for (uint32_t k = 0, count = testbed_.aggregator_count(); k < count; ++k) hosts.push_back(testbed_.aggregator(k));
  return hosts;
}

void Cluster::start_aggregator(Clock::time_point deadline, AggregatorKind kind) {
  aggregators_.clear();  // stops servers of an earlier start
  kind_ = kind;
  if (kind == AggregatorKind::Gloo) return;
  const std::vector<HostLink> hosts = server_hosts();
  // All start before any is waited for: they come up in parallel.
  for (const HostLink& host : hosts)
    aggregators_.emplace_back(
        ProcessSpec{.argv = server_argv(binary_, kind, host, result_mode_), .netns = host.netns, .output_file = std::nullopt});
  for (size_t k = 0; k < hosts.size(); ++k)
    wait_for_tcp_port(hosts[k].netns, hosts[k].address, service_port(kind), aggregators_[k], deadline);
}

ProcessResult Cluster::stop_aggregator() {
  if (aggregators_.empty()) return {};
  // Signalled all at once they shut down in parallel; terminate() then waits for each.
  for (Process& server : aggregators_)
    if (!server.poll()) kill(server.pid(), SIGTERM);
  ProcessResult combined{.exit_code = 0, .timed_out = false, .output = {}};
  std::vector<std::string> outputs;
  for (Process& server : aggregators_) {
    ProcessResult result = server.terminate();
    if (combined.exit_code == 0) combined.exit_code = result.exit_code;
    combined.timed_out = combined.timed_out || result.timed_out;
    outputs.push_back(std::move(result.output));
  }
  aggregators_.clear();
  combined.output = concatenated(outputs);
  return combined;
}

bool Cluster::aggregator_running() {
  return !aggregators_.empty() && std::ranges::all_of(aggregators_, [](Process& server) { return !server.poll(); });
}

std::vector<pid_t> Cluster::aggregator_pids() const {
  std::vector<pid_t> pids;
  for (const Process& server : aggregators_) pids.push_back(server.pid());
  return pids;
}

std::string Cluster::aggregator_output() const {
  std::vector<std::string> outputs;
  for (const Process& server : aggregators_) outputs.push_back(server.output());
  return concatenated(outputs);
}

Cluster::JobServers Cluster::job_servers(uint32_t workers) const {
  JobServers job{.backend = backend_of(kind_), .servers = {}, .root = {}, .ranks_per_leaf = 0,
                 .port = service_port(kind_)};
  for (const HostLink& host : server_hosts()) job.servers.push_back(host.address);
  const bool xagg = kind_ == AggregatorKind::Xdp || kind_ == AggregatorKind::XdpTxResults;
  job.ranks_per_leaf = xagg ? testbed_.layout().ranks_per_leaf(workers) : 0;
  if (job.ranks_per_leaf != 0) {
    job.root = job.servers.back();
    job.servers.pop_back();
  }
  return job;
}

std::vector<ProcessResult> Cluster::run_workers(const JobSpec& job, Clock::time_point deadline,
                                                const std::function<bool()>& cancelled) {
  std::optional<TempDirectory> rendezvous;
  if (kind_ == AggregatorKind::Gloo) rendezvous.emplace(testbed_.prefix() + "-gloo");
  const JobServers servers = job_servers(job.workers);
  const std::string aggregators = fmt::format("{}", fmt::join(servers.servers, ","));
  std::vector<Process> workers;
  for (uint32_t rank = 0; rank < job.workers; ++rank) {
    auto delay = job.start_delay_ms.find(rank);
    HostLink host = testbed_.worker(rank);
    std::vector<std::string> argv{
        binary_, "worker", "--backend", servers.backend, "--aggregator", aggregators,
        "--control-port", std::to_string(servers.port), "--job", std::to_string(job.job_id), "--rank",
        std::to_string(rank), "--world-size", std::to_string(job.workers), "--elements", std::to_string(job.elements),
        "--iterations", std::to_string(job.iterations), "--dtype", job.dtype, "--op", job.op, "--seed",
        std::to_string(job.seed), "--magnitudes", job.magnitudes, "--start-delay-ms",
        std::to_string(delay == job.start_delay_ms.end() ? 0 : delay->second), "--collective", job.collective,
        "--json"};
    if (rendezvous)
      argv.insert(argv.end(), {"--rendezvous", rendezvous->path().string(), "--local-address", host.address});
    if (!job.aggregator_weights.empty())
      argv.insert(argv.end(), {"--aggregator-weights", fmt::format("{}", fmt::join(job.aggregator_weights, ","))});
    if (job.wire_bits != 32) argv.insert(argv.end(), {"--wire-bits", std::to_string(job.wire_bits)});
    if (aggregator_dead_after_.count() > 0)
      argv.insert(argv.end(), {"--aggregator-dead-after-ms", std::to_string(aggregator_dead_after_.count())});
    if (!servers.root.empty())
      argv.insert(argv.end(), {"--root-aggregator", servers.root, "--ranks-per-leaf",
                               std::to_string(servers.ranks_per_leaf)});
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
