#include "daemon.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "admission.h"
#include "inet.h"
#include "job_registry.h"
#include "link_stats.h"
#include "metrics.h"
#include "peer_log_limit.h"
#include "service_setup.h"
#include "unique_fd.h"

namespace xagg::control {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(fmt::format("{}: {}", what, std::strerror(errno)));
}

UniqueFd listen_on(in_addr address, uint16_t port) {
  UniqueFd socket_fd(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!socket_fd) fail("creating the control socket");
  int on = 1;
  setsockopt(socket_fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr = address;
  local.sin_port = htons(port);
  if (bind(socket_fd.get(), reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0)
    fail(fmt::format("binding the control endpoint {}:{}", to_string(address), port));
  if (listen(socket_fd.get(), SOMAXCONN) != 0) fail("listening on the control endpoint");
  return socket_fd;
}

// Refuses result options that cannot work, naming the problem.
void check_result_options(const DaemonOptions& options) {
  const bool multicast = options.results == wire::ResultMode::Multicast;
  if (multicast && !options.multicast_base)
    throw std::runtime_error("--results multicast needs --multicast-group (e.g. 239.18.0.0): the group of the job "
                             "in slot 0");
  if (options.multicast_base && !multicast)
    throw std::runtime_error("--multicast-group is used only with --results multicast");
  if (options.multicast_base) {
    const uint32_t first = ntohl(options.multicast_base->s_addr);
    const uint32_t last = first + XAGG_MAX_JOBS - 1;
    if (!IN_MULTICAST(first) || !IN_MULTICAST(last) || (first >> 8) == (INADDR_UNSPEC_GROUP >> 8))
      throw std::runtime_error(fmt::format(
          "--multicast-group {}: the groups of all {} job slots ({} to {}) must be IPv4 multicast addresses outside "
          "224.0.0.0/24 (link-local, never routed); use an administratively scoped one such as 239.18.0.0",
          to_string(*options.multicast_base), XAGG_MAX_JOBS, to_string(*options.multicast_base),
          to_string(in_addr{htonl(last)})));
  }
  if (options.engine == EngineKind::Userspace && options.results && options.results != wire::ResultMode::Broadcast)
    throw std::runtime_error(fmt::format("--results {}: the userspace engine (a baseline) sends RESULTs by broadcast "
                                         "only",
                                         wire::to_string(*options.results)));
}

// A field of /proc/meminfo in bytes; nullopt if it cannot be read.
std::optional<uint64_t> meminfo_bytes(std::string_view field) {
  std::ifstream meminfo("/proc/meminfo");
  std::string name;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> name >> kib >> unit)
    if (name.size() == field.size() + 1 && name.starts_with(field) && name.back() == ':') return kib * 1024;
  return std::nullopt;
}

// Cells are BPF map memory, which is never swapped: a quota above the host's
// memory is a mistake refused now, not an out-of-memory kill with a job running.
void check_memory_quota(uint64_t quota) {
  constexpr double kGiB = 1 << 30;
  if (const auto total = meminfo_bytes("MemTotal"); total && quota > *total)
    throw std::runtime_error(fmt::format("--memory-quota {} bytes ({:.1f} GiB) exceeds this host's memory, {} bytes "
                                         "({:.1f} GiB, MemTotal): the jobs' cells are kernel memory that is never "
                                         "swapped; give at most what the host can spare",
                                         quota, quota / kGiB, *total, *total / kGiB));
  if (const auto available = meminfo_bytes("MemAvailable"); available && quota > *available)
    spdlog::warn("--memory-quota {} bytes ({:.1f} GiB) exceeds the memory available now, {} bytes ({:.1f} GiB, "
                 "MemAvailable): jobs that fill the quota may fail to get their cells",
                 quota, quota / kGiB, *available, *available / kGiB);
}

// Jobs need packets of the smallest size XAgg supports on every link
// (docs/protocol.md section 1); an interface below it could serve none.
void check_interface_mtu(const std::string& interface) {
  if (const auto mtu = mtu_of(interface); mtu && *mtu < wire::kMinLinkMtu)
    throw std::runtime_error(fmt::format("interface {} has MTU {}, below the {} every link of a job needs "
                                         "(docs/protocol.md section 1); raise it (ip link set dev {} mtu 9000)",
                                         interface, *mtu, wire::kMinLinkMtu, interface));
}

std::string describe_results(const DaemonOptions& options, const InterfaceAddress& interface) {
  if (!options.results)
    return fmt::format("broadcast to {} when a job's ranks are all on {}/{}, else unicast",
                       to_string(interface.broadcast), to_string(interface.address), to_string(interface.netmask));
  switch (*options.results) {
    case wire::ResultMode::Broadcast: return fmt::format("broadcast to {}", to_string(interface.broadcast));
    case wire::ResultMode::Multicast:
      return fmt::format("multicast to {} plus the job's slot", to_string(*options.multicast_base));
    case wire::ResultMode::Unicast: break;
  }
  return "unicast to every rank";
}

// SIGINT and SIGTERM become readable events instead of interrupting the loop.
UniqueFd stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  if (sigprocmask(SIG_BLOCK, &signals, nullptr) != 0) fail("blocking SIGINT and SIGTERM");
  UniqueFd fd(signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!fd) fail("creating a signalfd");
  return fd;
}

struct Connection {
  UniqueFd socket;
  in_addr peer{};
  std::chrono::steady_clock::time_point accepted_at;
  std::string received;  // bytes after the last complete line
  std::string to_send;
  bool closing = false;  // an Error went out: close once to_send is empty, read nothing more
  std::string nonce;     // the challenge sent to it, when the daemon has a cluster secret
  bool proof_awaited = false;  // challenged, and no join with a proof came yet
};

class ControlServer final : public Outbox, public Parents {
 public:
  ControlServer(const DaemonOptions& options, UniqueFd signals, Engine& engine, const InterfaceAddress& interface,
                PeerLogLimit& log_limit)
      : log_limit_(log_limit),
        listener_(listen_on(interface.address, options.control_port)),
        signals_(std::move(signals)),
        epoll_(epoll_create1(EPOLL_CLOEXEC)),
        engine_(engine),
        secret_(options.secret),
        interface_name_(options.interface),
        registry_(engine,
                  {options.data_port, options.result_port_base, options.memory_quota, interface.broadcast,
                   mtu_of(options.interface).value_or(UINT16_MAX), options.results, interface,
                   options.multicast_base, mac_of(options.interface).value_or(std::array<uint8_t, 6>{}),
                   options.control_port},
                  *this, *this),
        parent_dead_after_(options.parent_dead_after),
        parent_events_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (!epoll_) fail("creating epoll");
    if (!parent_events_) fail("creating an eventfd");
    watch(listener_.get(), kListenerId, EPOLLIN);
    watch(signals_.get(), kSignalId, EPOLLIN);
    watch(parent_events_.get(), kParentEventsId, EPOLLIN);
    spdlog::info("control endpoint on {}:{}, RESULTs by {}", to_string(interface.address), options.control_port,
                 describe_results(options, interface));
    if (options.metrics_address) {
      metrics_ = std::make_unique<MetricsServer>(*options.metrics_address, options.metrics_port);
      publish_metrics();
      spdlog::info("metrics on http://{}:{}/metrics", to_string(*options.metrics_address), options.metrics_port);
    }
  }

  void run() {
    std::array<epoll_event, 64> events;
    while (!stopping_) {
      int count = epoll_wait(epoll_.get(), events.data(), events.size(), next_timer_in_ms());
      if (count < 0 && errno == EINTR) continue;
      if (count < 0) fail("waiting for events");
      for (int i = 0; i < count; i++) dispatch(events[i]);
      resume_accepts_when_due();
      housekeeping();
      close_finished();
    }
  }

  void send(ConnectionId id, const Message& message) override {
    auto it = connections_.find(id);
    if (it == connections_.end() || it->second.closing) return;
    Connection& connection = it->second;
    connection.to_send += encode(message) + "\n";
    flush(id, connection);
    // A peer that asks without reading the answers would grow this without
    // bound; it is closed instead (after this event: the registry may be
    // in the middle of a call about it).
    if (connection.to_send.size() > kMaxUnsentBytes) {
      ++counters_.connections_closed_flooding;
      spdlog::warn("{}: over {} bytes of replies unread; closing it", describe(id), kMaxUnsentBytes);
      connection.to_send.clear();
      connection.closing = true;
    }
  }

  void close_after_sending(ConnectionId id) override {
    if (auto it = connections_.find(id); it != connections_.end()) it->second.closing = true;
  }

  std::string describe(ConnectionId id) const override {
    auto it = connections_.find(id);
    return it == connections_.end() ? fmt::format("connection {}", id)
                                    : fmt::format("connection {} from {}", id, to_string(it->second.peer));
  }

  void join(uint32_t job_id, const sockaddr_in& parent, const JoinRequest& request) override {
    parent_links_[job_id] = std::make_unique<ParentLink>(
        next_link_id_++, parent, request, secret_, interface_name_, parent_dead_after_, [this](ParentEvent event) {
          {
            std::lock_guard lock(parent_queue_mutex_);
            parent_queue_.push_back(std::move(event));
          }
          uint64_t one = 1;
          [[maybe_unused]] ssize_t written = write(parent_events_.get(), &one, sizeof(one));
        });
  }

  void end(uint32_t job_id, bool completed) override {
    auto it = parent_links_.find(job_id);
    if (it == parent_links_.end()) return;
    if (completed) it->second->leave_first();
    parent_links_.erase(it);  // joins its thread, after the leave is sent
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr ConnectionId kListenerId = 0;  // also "no connection" for the registry
  static constexpr std::chrono::milliseconds kAcceptPause{100};
  static constexpr size_t kMaxUnsentBytes = size_t{1} << 20;
  static constexpr std::chrono::seconds kJoinWithin{5};
  static constexpr std::chrono::seconds kHousekeepingInterval{1};
  static constexpr std::chrono::seconds kAcceptPauseLogInterval{10};
  static constexpr ConnectionId kSignalId = 1;
  static constexpr ConnectionId kParentEventsId = 2;

  void watch(int fd, ConnectionId id, uint32_t events, int op = EPOLL_CTL_ADD) {
    epoll_event event{};
    event.events = events;
    event.data.u64 = id;
    if (epoll_ctl(epoll_.get(), op, fd, &event) != 0) fail("registering with epoll");
  }

  void dispatch(const epoll_event& event) {
    if (event.data.u64 == kListenerId) return accept_all();
    if (event.data.u64 == kParentEventsId) return handle_parent_events();
    if (event.data.u64 == kSignalId) {
      signalfd_siginfo info{};
      if (read(signals_.get(), &info, sizeof(info)) == sizeof(info))
        spdlog::info("received {}, stopping", strsignal(static_cast<int>(info.ssi_signo)));
      stopping_ = true;
      return;
    }
    auto it = connections_.find(event.data.u64);
    if (it == connections_.end()) return;
    PeerLogLimit::Scope peer_lines(it->second.peer);
    if (event.events & EPOLLOUT) flush(it->first, it->second);
    if (event.events & (EPOLLIN | EPOLLHUP | EPOLLERR)) receive(it->first, it->second);
  }

  // Events of the leaf jobs' parent links, for links still current (a job's
  // link may have ended, or been replaced, since its thread posted them).
  void handle_parent_events() {
    uint64_t count = 0;
    [[maybe_unused]] ssize_t read_bytes = read(parent_events_.get(), &count, sizeof(count));
    std::deque<ParentEvent> events;
    {
      std::lock_guard lock(parent_queue_mutex_);
      events.swap(parent_queue_);
    }
    for (ParentEvent& event : events) {
      auto link = parent_links_.find(event.job_id);
      if (link == parent_links_.end() || link->second->id() != event.link) continue;
      if (event.started) {
        registry_.on_parent_started(event.job_id, *event.started);
      } else {
        parent_links_.erase(link);
        registry_.on_parent_failed(event.job_id, event.error);
      }
    }
  }

  // A worker host that dies or drops off the network sends no FIN, and a
  // running job writes nothing on its control connection: without probes
  // its membership, and so its job's memory, would be held forever. With
  // these the connection fails within about a minute, which aborts the job.
  static void detect_dead_peer(int fd) {
    const std::array<std::array<int, 3>, 5> options = {{{SOL_SOCKET, SO_KEEPALIVE, 1},
                                                        {IPPROTO_TCP, TCP_KEEPIDLE, 30},
                                                        {IPPROTO_TCP, TCP_KEEPINTVL, 5},
                                                        {IPPROTO_TCP, TCP_KEEPCNT, 4},
                                                        {IPPROTO_TCP, TCP_USER_TIMEOUT, 60000}}};
    for (const auto& [level, name, value] : options)
      if (setsockopt(fd, level, name, &value, sizeof(value)) != 0)
        spdlog::warn("control connection: setsockopt({}): {}", name, std::strerror(errno));
  }

  // The answers to a member's heartbeats are a thin stream: a lost one is
  // retransmitted every RTO rather than after 0.2, 0.4, 0.8 s, so that a
  // lossy path costs the member's liveness watch less silence (peer_liveness.h).
  static void retransmit_answers_linearly(int fd) {
    const int on = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, &on, sizeof(on)) != 0)
      spdlog::warn("control connection: setsockopt(TCP_THIN_LINEAR_TIMEOUTS): {}", std::strerror(errno));
  }

  void accept_all() {
    while (true) {
      sockaddr_in peer{};
      socklen_t length = sizeof(peer);
      int fd = accept4(listener_.get(), reinterpret_cast<sockaddr*>(&peer), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) return pause_accepts(errno);
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED)
          spdlog::warn("accepting a control connection: {}", std::strerror(errno));
        return;
      }
      detect_dead_peer(fd);
      retransmit_answers_linearly(fd);
      ConnectionId id = next_id_++;
      connections_[id] = Connection{UniqueFd(fd), peer.sin_addr, Clock::now(), {}, {}, false, {}, false};
      ++counters_.connections_accepted;
      watch(fd, id, EPOLLIN);
      spdlog::debug("connection {} from {}", id, to_string(peer));
    }
  }

  // Out of descriptors (or memory), the pending connection stays queued and
  // the listener stays readable: accepting again at once would spin. The
  // listener is left out of epoll for kAcceptPause, and the condition is
  // logged at most once per kAcceptPauseLogInterval.
  void pause_accepts(int error) {
    const auto now = Clock::now();
    watch(listener_.get(), kListenerId, 0, EPOLL_CTL_MOD);
    accepts_resume_at_ = now + kAcceptPause;
    ++accept_pauses_;
    if (now < next_accept_pause_log_) return;
    next_accept_pause_log_ = now + kAcceptPauseLogInterval;
    spdlog::warn("accepting control connections: {}; pausing accepts for {} ms ({} pauses so far; raise the "
                 "open-file limit, e.g. LimitNOFILE)",
                 std::strerror(error), kAcceptPause.count(), accept_pauses_);
  }

  // Until accepts resume or the next housekeeping.
  int next_timer_in_ms() const {
    Clock::time_point next = next_housekeeping_;
    if (accepts_resume_at_) next = std::min(next, *accepts_resume_at_);
    auto left = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now());
    return static_cast<int>(std::max<int64_t>(0, left.count()));
  }

  // Once a second: connections that never joined go, /metrics is refreshed.
  void housekeeping() {
    const auto now = Clock::now();
    if (now < next_housekeeping_) return;
    next_housekeeping_ = now + kHousekeepingInterval;
    close_unjoined(now);
    log_limit_.report_suppressed();
    if (metrics_) publish_metrics();
  }

  void publish_metrics() {
    MetricsState state;
    state.uptime_seconds = std::chrono::duration<double>(Clock::now() - started_).count();
    state.connections_open = connections_.size();
    state.control = counters_;
    registry_.fill_metrics(state);
    state.log_lines_suppressed = log_limit_.suppressed_total();
    state.packets = engine_.counters();
    state.program = engine_.program_run_stats();
    state.interface = interface_name_;
    try {
      state.link = dataplane::read_link_counters(interface_name_);
    } catch (const std::runtime_error& error) {
      spdlog::debug("metrics: {}", error.what());  // a refresh without them; once a second, so not a warning
    }
    metrics_->publish(render_metrics(state));
  }

  // A connection holds a descriptor and a slot in epoll: one that has not
  // joined a job within kJoinWithin is closed, so idle or abandoned
  // connections cannot pile up.
  void close_unjoined(Clock::time_point now) {
    std::vector<ConnectionId> late;
    for (const auto& [id, connection] : connections_)
      if (!connection.closing && !registry_.has_joined(id) && now - connection.accepted_at > kJoinWithin)
        late.push_back(id);
    counters_.connections_closed_idle += late.size();
    for (ConnectionId id : late) {
      PeerLogLimit::Scope peer_lines(connections_.at(id).peer);
      reject(id, fmt::format("no join within {} s (from {})", kJoinWithin.count(),
                             to_string(connections_.at(id).peer)));
    }
  }

  void resume_accepts_when_due() {
    if (!accepts_resume_at_ || Clock::now() < *accepts_resume_at_) return;
    accepts_resume_at_.reset();
    watch(listener_.get(), kListenerId, EPOLLIN, EPOLL_CTL_MOD);
  }

  void receive(ConnectionId id, Connection& connection) {
    char buffer[4096];
    while (!connection.closing) {
      ssize_t received = recv(connection.socket.get(), buffer, sizeof(buffer), 0);
      if (received < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (received <= 0) return drop(id);  // peer closed or failed
      connection.received.append(buffer, static_cast<size_t>(received));
      handle_lines(id, connection);
    }
  }

  void handle_lines(ConnectionId id, Connection& connection) {
    size_t end;
    while (!connection.closing && (end = connection.received.find('\n')) != std::string::npos) {
      std::string line = connection.received.substr(0, end);
      connection.received.erase(0, end + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      handle_message(id, connection, line);
    }
    if (!connection.closing && connection.received.size() > kMaxLineBytes)
      reject(id, fmt::format("line longer than {} bytes", kMaxLineBytes));
  }

  void handle_message(ConnectionId id, Connection& connection, const std::string& line) {
    Message message;
    try {
      message = decode(line);
    } catch (const ProtocolError& error) {
      return reject(id, error.what());
    }
    if (auto* join = std::get_if<JoinRequest>(&message)) {
      if (admitted(id, connection, *join)) registry_.on_join(id, connection.peer, *join);
      return;
    }
    if (std::holds_alternative<Leave>(message)) return registry_.on_leave(id);
    if (auto* status = std::get_if<StatusRequest>(&message)) return registry_.on_status(id, *status);
    if (auto* reshard = std::get_if<ReshardRequest>(&message)) return registry_.on_reshard(id, *reshard);
    if (std::holds_alternative<Ping>(message)) return send(id, Pong{});
    if (auto* error = std::get_if<Error>(&message)) {
      spdlog::warn("{} reported: {}", describe(id), error->message);
      return close_after_sending(id);  // closed after this event, as if the peer had hung up
    }
    reject(id, "only join, leave, status, reshard, ping and error go to the aggregator");
  }

  // With a cluster secret, a join is admitted only with the proof for the
  // nonce this connection was challenged with (docs/protocol.md 2.1).
  bool admitted(ConnectionId id, Connection& connection, const JoinRequest& join) {
    if (secret_.empty()) return true;
    if (join.auth.empty() && connection.nonce.empty()) {
      connection.nonce = random_nonce();
      connection.proof_awaited = true;
      send(id, Challenge{connection.nonce});
      return false;
    }
    connection.proof_awaited = false;
    if (!connection.nonce.empty() &&
        proof_matches(join_proof(secret_, connection.nonce, join.job_id, join.rank, join.world_size), join.auth))
      return true;
    ++counters_.joins_refused[static_cast<size_t>(JoinRefusal::Unauthenticated)];
    reject(id, fmt::format("job {}: rank {}: join not authenticated (no proof of the cluster secret for this "
                           "connection's challenge)",
                           join.job_id, join.rank));
    return false;
  }

  void reject(ConnectionId id, const std::string& reason) {
    spdlog::warn("{}: {}", describe(id), reason);
    send(id, Error{reason});
    close_after_sending(id);
  }

  void flush(ConnectionId id, Connection& connection) {
    while (!connection.to_send.empty()) {
      ssize_t sent = ::send(connection.socket.get(), connection.to_send.data(), connection.to_send.size(),
                            MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (sent < 0) {  // the peer is gone; the read side reports it
        connection.to_send.clear();
        break;
      }
      connection.to_send.erase(0, static_cast<size_t>(sent));
    }
    watch(connection.socket.get(), id, connection.to_send.empty() ? EPOLLIN : EPOLLIN | EPOLLOUT, EPOLL_CTL_MOD);
  }

  // The registry learns of every closed connection, whoever closed it. A
  // peer that leaves after the challenge without a proof (a worker without
  // the secret) was refused as surely as one with a wrong proof.
  void drop(ConnectionId id) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    PeerLogLimit::Scope peer_lines(it->second.peer);
    if (it->second.proof_awaited) {
      ++counters_.joins_refused[static_cast<size_t>(JoinRefusal::Unauthenticated)];
      spdlog::warn("{}: join not authenticated (closed after the challenge without a proof of the cluster secret)",
                   describe(id));
    }
    registry_.on_disconnect(id);  // while the connection can still be described
    connections_.erase(it);       // closing the socket also removes it from epoll
    spdlog::debug("connection {} closed", id);
  }

  void close_finished() {
    std::vector<ConnectionId> finished;
    for (const auto& [id, connection] : connections_)
      if (connection.closing && connection.to_send.empty()) finished.push_back(id);
    for (ConnectionId id : finished) drop(id);
  }

  PeerLogLimit& log_limit_;
  UniqueFd listener_;
  UniqueFd signals_;
  UniqueFd epoll_;
  std::map<ConnectionId, Connection> connections_;
  Engine& engine_;
  const std::string secret_;  // the cluster secret; empty: joins need no proof
  const std::string interface_name_;
  JobRegistry registry_;
  const std::chrono::milliseconds parent_dead_after_;
  UniqueFd parent_events_;  // eventfd: a parent link posted to parent_queue_
  std::mutex parent_queue_mutex_;
  std::deque<ParentEvent> parent_queue_;
  uint64_t next_link_id_ = 1;
  std::map<uint32_t, std::unique_ptr<ParentLink>> parent_links_;  // by leaf job; after what their threads use
  ConnectionId next_id_ = kParentEventsId + 1;
  bool stopping_ = false;
  std::optional<Clock::time_point> accepts_resume_at_;  // set while accepts pause
  Clock::time_point next_accept_pause_log_{};
  Clock::time_point next_housekeeping_{};
  const Clock::time_point started_ = Clock::now();
  ControlCounters counters_;  // the fields the server counts; the registry counts the rest
  std::unique_ptr<MetricsServer> metrics_;
  uint64_t accept_pauses_ = 0;
};

}  // namespace

void run_aggregator(const DaemonOptions& options) {
  PeerLogLimit log_limit;  // first: before any other thread logs
  check_result_options(options);
  check_memory_quota(options.memory_quota);
  check_interface_mtu(options.interface);
  if (options.result_port_base + XAGG_MAX_JOBS - 1 > UINT16_MAX)
    throw std::runtime_error(fmt::format("--result-port-base {} leaves no room for {} jobs", options.result_port_base,
                                         XAGG_MAX_JOBS));
  UniqueFd signals = stop_signals();  // before the engine starts threads, which inherit the blocked signals
  std::unique_ptr<Engine> engine;
  if (options.engine == EngineKind::Xdp) {
    if (auto problem = pin_root_problem())
      throw std::runtime_error(fmt::format("cannot pin the data plane's counters: {}; fix: {}", *problem,
                                           prepare_command()));
    engine = make_xdp_engine(options.interface, options.mode, {options.data_port, options.result_fan_out});  // first: it explains a missing interface best
  } else {
    unsigned threads = options.userspace_threads ? options.userspace_threads : std::thread::hardware_concurrency();
    engine = make_userspace_engine(options.data_port, threads);
  }

  std::optional<InterfaceAddress> interface = ipv4_of(options.interface);
  if (!interface && !options.broadcast)
    throw std::runtime_error(fmt::format(
        "interface '{}' has no IPv4 address to derive the broadcast address from; give --broadcast", options.interface));
  InterfaceAddress endpoint = interface.value_or(InterfaceAddress{in_addr{htonl(INADDR_ANY)}, {}});
  if (options.broadcast) endpoint.broadcast = *options.broadcast;
  ControlServer server(options, std::move(signals), *engine, endpoint, log_limit);
  server.run();
}

}  // namespace xagg::control
