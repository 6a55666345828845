#include "metrics.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <httplib.h>

#include <stdexcept>

#include "counters.h"

namespace xagg::control {
namespace {

constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

void family(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

template <class Value>
void sample(std::string& out, const char* name, Value value, const std::string& labels = "") {
  if (labels.empty())
    out += fmt::format("{} {}\n", name, value);
  else
    out += fmt::format("{}{{{}}} {}\n", name, labels, value);
}

}  // namespace

std::string render_metrics(const MetricsState& state) {
  std::string out;
  family(out, "xagg_uptime_seconds", "gauge", "Seconds since the aggregator started.");
  sample(out, "xagg_uptime_seconds", fmt::format("{:.3f}", state.uptime_seconds));
  family(out, "xagg_jobs", "gauge", "Jobs registered now.");
  sample(out, "xagg_jobs", state.jobs);
  family(out, "xagg_ranks", "gauge", "Ranks joined to the registered jobs.");
  sample(out, "xagg_ranks", state.ranks);
  family(out, "xagg_memory_used_bytes", "gauge", "Aggregation cell memory the registered jobs hold.");
  sample(out, "xagg_memory_used_bytes", state.memory_used_bytes);
  family(out, "xagg_memory_quota_bytes", "gauge", "Aggregation cell memory all jobs may hold (--memory-quota).");
  sample(out, "xagg_memory_quota_bytes", state.memory_quota_bytes);
  family(out, "xagg_connections_open", "gauge", "Control connections open now.");
  sample(out, "xagg_connections_open", state.connections_open);

  const ControlCounters& control = state.control;
  family(out, "xagg_connections_accepted_total", "counter", "Control connections accepted.");
  sample(out, "xagg_connections_accepted_total", control.connections_accepted);
  family(out, "xagg_connections_closed_total", "counter", "Control connections the daemon closed, by reason.");
  sample(out, "xagg_connections_closed_total", control.connections_closed_idle, "reason=\"no_join\"");
  sample(out, "xagg_connections_closed_total", control.connections_closed_flooding, "reason=\"replies_unread\"");
  family(out, "xagg_joins_total", "counter", "Join requests, by result.");
  sample(out, "xagg_joins_total", control.joins_accepted, "result=\"accepted\"");
  sample(out, "xagg_joins_total", control.joins_refused, "result=\"refused\"");
  sample(out, "xagg_joins_total", control.joins_unauthenticated, "result=\"unauthenticated\"");
  family(out, "xagg_jobs_created_total", "counter", "Jobs created.");
  sample(out, "xagg_jobs_created_total", control.jobs_created);
  family(out, "xagg_jobs_ended_total", "counter", "Jobs removed, by how they ended.");
  sample(out, "xagg_jobs_ended_total", control.jobs_completed, "how=\"completed\"");
  sample(out, "xagg_jobs_ended_total", control.jobs_aborted, "how=\"aborted\"");

  if (state.program) {
    family(out, "xagg_bpf_run_seconds_total", "counter",
           "Time the XDP program ran, counted only while kernel.bpf_stats_enabled is 1.");
    sample(out, "xagg_bpf_run_seconds_total", fmt::format("{:.9f}", state.program->run_time_ns / 1e9));
    family(out, "xagg_bpf_runs_total", "counter",
           "Packets the XDP program ran on, counted only while kernel.bpf_stats_enabled is 1.");
    sample(out, "xagg_bpf_runs_total", state.program->runs);
  }

  // The interface's own counters: frames a ring dropped before XDP ran show only here.
  for (const auto& [name, value] : state.link) {
    const std::string metric = fmt::format("xagg_interface_{}_total", name);
    family(out, metric.c_str(), "counter",
           fmt::format("The aggregator interface's {} (kernel rtnl_link_stats64, as ip -s -s link shows it).", name)
               .c_str());
    sample(out, metric.c_str(), value, fmt::format("interface=\"{}\"", state.interface));
  }

  // Totals never go down: packets of jobs that ended stay counted.
  dataplane::CounterRow total = state.packets.total();
  for (size_t counter = 0; counter < total.size(); ++counter) total[counter] += state.ended_jobs_packets[counter];
  family(out, "xagg_packets_total", "counter",
         "DATA packets by outcome (docs/protocol.md 3.3-3.4), every job since the start and packets of no job.");
  for (int counter = 0; counter < XAGG_CNT_COUNT; ++counter)
    sample(out, "xagg_packets_total", total[counter],
           fmt::format("outcome=\"{}\"", dataplane::counter_name(static_cast<xagg_counter>(counter))));
  family(out, "xagg_job_packets_total", "counter", "DATA packets of each registered job, by outcome.");
  for (const dataplane::JobCounters& job : state.packets.jobs)
    for (int counter = 0; counter < XAGG_CNT_COUNT; ++counter)
      sample(out, "xagg_job_packets_total", job.counters[counter],
             fmt::format("job=\"{}\",outcome=\"{}\"", job.job_id,
                         dataplane::counter_name(static_cast<xagg_counter>(counter))));
  return out;
}

MetricsServer::MetricsServer(in_addr address, uint16_t port) : server_(std::make_unique<httplib::Server>()) {
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    std::lock_guard lock(mutex_);
    response.set_content(text_, kContentType);
  });
  server_->Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok\n", "text/plain");
  });
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &address, text, sizeof(text));
  if (!server_->bind_to_port(text, port))
    throw std::runtime_error(fmt::format("metrics: cannot listen on {}:{}", text, port));
  thread_ = std::thread([this] { server_->listen_after_bind(); });
}

MetricsServer::~MetricsServer() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

void MetricsServer::publish(std::string text) {
  std::lock_guard lock(mutex_);
  text_ = std::move(text);
}

}  // namespace xagg::control
