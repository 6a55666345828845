#include "metrics.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

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

const char* refusal_name(JoinRefusal reason) {
  switch (reason) {
    case JoinRefusal::Invalid: return "invalid";
    case JoinRefusal::Mtu: return "mtu";
    case JoinRefusal::Subnet: return "subnet";
    case JoinRefusal::Capacity: return "capacity";
    case JoinRefusal::Memory: return "memory";
    case JoinRefusal::Mismatch: return "mismatch";
    case JoinRefusal::Unauthenticated: break;
  }
  return "unauthenticated";
}

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
  const size_t unauthenticated = static_cast<size_t>(JoinRefusal::Unauthenticated);
  uint64_t refused = 0;
  for (size_t reason = 0; reason < kJoinRefusalCount; ++reason)
    if (reason != unauthenticated) refused += control.joins_refused[reason];
  family(out, "xagg_joins_total", "counter", "Join requests, by result.");
  sample(out, "xagg_joins_total", control.joins_accepted, "result=\"accepted\"");
  sample(out, "xagg_joins_total", refused, "result=\"refused\"");
  sample(out, "xagg_joins_total", control.joins_refused[unauthenticated], "result=\"unauthenticated\"");
  family(out, "xagg_joins_refused_total", "counter", "Join requests refused, by reason (unauthenticated included).");
  for (size_t reason = 0; reason < kJoinRefusalCount; ++reason)
    sample(out, "xagg_joins_refused_total", control.joins_refused[reason],
           fmt::format("reason=\"{}\"", refusal_name(static_cast<JoinRefusal>(reason))));
  family(out, "xagg_log_lines_suppressed_total", "counter",
         "Log lines dropped by the per-peer rate limit (each peer's count is logged too).");
  sample(out, "xagg_log_lines_suppressed_total", state.log_lines_suppressed);
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

struct MetricsServer::Client {
  UniqueFd socket;
  Clock::time_point deadline;  // request by then, or closed
  std::string received;
  std::string to_send;
  bool answered = false;   // to_send holds the whole response; then the read side is drained
  bool peer_done = false;  // the peer sent FIN
};

namespace {

constexpr size_t kMaxRequestHead = 8192;
// After the response, what the client still sends is read and dropped for
// this long before the close: closing with unread bytes resets the
// connection, and the client may lose the response.
constexpr std::chrono::seconds kDrainFor{2};
constexpr std::chrono::milliseconds kAcceptPause{100};

std::string http_response(std::string_view status, std::string_view content_type, std::string_view body,
                          bool with_body, std::string_view extra_headers = "") {
  return fmt::format("HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n{}", status,
                     content_type, body.size(), extra_headers, with_body ? body : std::string_view{});
}

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(fmt::format("metrics: {}: {}", what, std::strerror(errno)));
}

void watch(int epoll, int fd, uint32_t events, int op) {
  epoll_event event{};
  event.events = events;
  event.data.fd = fd;
  if (epoll_ctl(epoll, op, fd, &event) != 0) fail("registering with epoll");
}

}  // namespace

MetricsServer::MetricsServer(in_addr address, uint16_t port)
    : listener_(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)),
      epoll_(epoll_create1(EPOLL_CLOEXEC)),
      stop_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      published_at_(Clock::now()) {
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &address, text, sizeof(text));
  if (!listener_ || !epoll_ || !stop_) fail("creating its sockets");
  int on = 1;
  setsockopt(listener_.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr = address;
  local.sin_port = htons(port);
  if (bind(listener_.get(), reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0 ||
      listen(listener_.get(), SOMAXCONN) != 0)
    fail(fmt::format("cannot listen on {}:{}", text, port));
  watch(epoll_.get(), listener_.get(), EPOLLIN, EPOLL_CTL_ADD);
  watch(epoll_.get(), stop_.get(), EPOLLIN, EPOLL_CTL_ADD);
  thread_ = std::thread([this] { serve(); });
}

MetricsServer::~MetricsServer() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t written = write(stop_.get(), &one, sizeof(one));
  thread_.join();
}

void MetricsServer::publish(std::string text) {
  std::lock_guard lock(mutex_);
  text_ = std::move(text);
  published_at_ = Clock::now();
}

void MetricsServer::serve() {
  std::array<epoll_event, 64> events;
  while (true) {
    const int count = epoll_wait(epoll_.get(), events.data(), events.size(), 1000);
    if (count < 0 && errno != EINTR) {
      spdlog::error("metrics: waiting for events: {}; /metrics and /healthz are no longer served",
                    std::strerror(errno));
      return;
    }
    for (int i = 0; i < count; ++i) {
      const int fd = events[i].data.fd;
      if (fd == stop_.get()) return;
      if (fd == listener_.get())
        accept_all();
      else
        on_event(fd, events[i].events);
    }
    close_expired();
  }
}

void MetricsServer::accept_all() {
  while (true) {
    UniqueFd fd(accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      if (errno != EMFILE && errno != ENFILE && errno != ENOBUFS && errno != ENOMEM) return;  // EAGAIN, aborted, ...
      // Out of descriptors: a connection makes room, or with none of its own
      // to close, accepts pause (the listener would stay readable).
      if (clients_.empty()) {
        watch(epoll_.get(), listener_.get(), 0, EPOLL_CTL_MOD);
        accepts_resume_at_ = Clock::now() + kAcceptPause;
        return;
      }
      close_nearest_deadline();
      continue;
    }
    if (clients_.size() >= kMaxConnections) close_nearest_deadline();
    const int raw = fd.get();
    watch(epoll_.get(), raw, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
    clients_.emplace(raw, Client{.socket = std::move(fd), .deadline = Clock::now() + kRequestWithin});
  }
}

void MetricsServer::on_event(int fd, uint32_t events) {
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  Client& client = it->second;
  char buffer[4096];
  while (!client.peer_done && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
    const ssize_t received = recv(fd, buffer, sizeof(buffer), 0);
    if (received < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (received < 0) return close_client(fd);
    if (received == 0) {
      client.peer_done = true;
      if (!client.answered) answer_with(client, answer(client.received));  // a request cut short is answered too
      break;
    }
    if (client.answered) continue;  // draining what follows the request
    client.received.append(buffer, static_cast<size_t>(received));
    if (client.received.find("\r\n\r\n") != std::string::npos || client.received.find("\n\n") != std::string::npos)
      answer_with(client, answer(client.received));
    else if (client.received.size() > kMaxRequestHead)
      answer_with(client, http_response("431 Request Header Fields Too Large", "text/plain",
                                        fmt::format("request head over {} bytes\n", kMaxRequestHead), true));
  }
  if (client.answered) respond(client);
}

void MetricsServer::answer_with(Client& client, std::string response) {
  client.to_send = std::move(response);
  client.answered = true;
  client.deadline = Clock::now() + kDrainFor;
}

void MetricsServer::respond(Client& client) {
  const int fd = client.socket.get();
  while (!client.to_send.empty()) {
    const ssize_t sent = send(fd, client.to_send.data(), client.to_send.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (sent < 0) return close_client(fd);
    client.to_send.erase(0, static_cast<size_t>(sent));
  }
  if (client.to_send.empty()) {
    if (client.peer_done) return close_client(fd);
    shutdown(fd, SHUT_WR);  // the response is whole: FIN, then drain until the peer closes
  }
  // Past the peer's FIN its socket stays readable: wait for room to send only.
  const uint32_t events = client.peer_done ? EPOLLOUT : client.to_send.empty() ? EPOLLIN | EPOLLRDHUP
                                                                                : EPOLLIN | EPOLLRDHUP | EPOLLOUT;
  watch(epoll_.get(), fd, events, EPOLL_CTL_MOD);
}

void MetricsServer::close_client(int fd) { clients_.erase(fd); }  // closing the socket removes it from epoll

// The connection that would be closed first anyway makes room for a new one.
void MetricsServer::close_nearest_deadline() {
  close_client(std::ranges::min_element(clients_, {}, [](const auto& entry) { return entry.second.deadline; })->first);
}

// Connections past their deadline: a request that did not arrive in time
// gets 408 if the socket takes it; a drained one is closed.
void MetricsServer::close_expired() {
  const auto now = Clock::now();
  if (accepts_resume_at_ && now >= *accepts_resume_at_) {
    accepts_resume_at_.reset();
    watch(epoll_.get(), listener_.get(), EPOLLIN, EPOLL_CTL_MOD);
  }
  std::vector<int> expired;
  for (const auto& [fd, client] : clients_)
    if (now >= client.deadline) expired.push_back(fd);
  for (int fd : expired) {
    Client& client = clients_.at(fd);
    if (!client.answered) {
      const std::string timeout =
          http_response("408 Request Timeout", "text/plain", "no complete request in time\n", true);
      [[maybe_unused]] ssize_t sent = send(fd, timeout.data(), timeout.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    close_client(fd);
  }
}

// The response to a request head (its request line is all that matters).
std::string MetricsServer::answer(std::string_view head) {
  const size_t line_end = head.find_first_of("\r\n");
  if (line_end == std::string_view::npos)
    return http_response("400 Bad Request", "text/plain", "incomplete request line\n", true);
  const std::string_view line = head.substr(0, line_end);
  const size_t method_end = line.find(' ');
  const size_t target_end = method_end == std::string_view::npos ? method_end : line.find(' ', method_end + 1);
  if (target_end == std::string_view::npos || !line.substr(target_end + 1).starts_with("HTTP/"))
    return http_response("400 Bad Request", "text/plain", "not an HTTP request line\n", true);
  const std::string_view method = line.substr(0, method_end);
  std::string_view path = line.substr(method_end + 1, target_end - method_end - 1);
  path = path.substr(0, path.find('?'));
  const bool with_body = method != "HEAD";
  if (path != "/metrics" && path != "/healthz")
    return http_response("404 Not Found", "text/plain", "only /metrics and /healthz are served\n", with_body);
  if (method != "GET" && method != "HEAD")
    return http_response("405 Method Not Allowed", "text/plain", "only GET and HEAD\n", true, "Allow: GET, HEAD\r\n");
  std::lock_guard lock(mutex_);
  if (path == "/metrics") return http_response("200 OK", kContentType, text_, with_body);
  const auto silent = std::chrono::duration<double>(Clock::now() - published_at_);
  if (silent > kStaleAfter)
    return http_response("503 Service Unavailable", "text/plain",
                         fmt::format("control loop stuck: no turn for {:.1f} s (unhealthy after {} s)\n",
                                     silent.count(), kStaleAfter.count()),
                         with_body);
  return http_response("200 OK", "text/plain", "ok\n", with_body);
}

}  // namespace xagg::control
