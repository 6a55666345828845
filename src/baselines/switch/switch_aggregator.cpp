#include "switch_aggregator.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fmt/format.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>

#include <csignal>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <vector>

#include "control_messages.h"
#include "unique_fd.h"
#include "xagg_switch.skel.h"

namespace xagg::baselines::switchml {
namespace {

[[noreturn]] void fail(const std::string& what, int error = errno) {
  throw std::runtime_error(fmt::format("{}: {}", what, std::strerror(error)));
}

void check(int rc, const std::string& what) {
  if (rc < 0) fail(what, -rc);
}

// The XDP program on one interface, with its maps; detached on destruction.
class SwitchDataplane {
 public:
  SwitchDataplane(const SwitchAggregatorOptions& options) : slots_(options.slots) {
    skeleton_ = xagg_switch_bpf__open();
    if (!skeleton_) fail("opening the switch XDP program");
    skeleton_->rodata->xsw_udp_port = options.data_port;
    check(bpf_map__set_max_entries(skeleton_->maps.xsw_slots, 2 * slots_), "sizing the slot pool");
    check(xagg_switch_bpf__load(skeleton_), "loading the switch XDP program");
    ifindex_ = static_cast<int>(if_nametoindex(options.interface.c_str()));
    if (ifindex_ == 0) fail(fmt::format("interface '{}'", options.interface));
    check(bpf_xdp_attach(ifindex_, bpf_program__fd(skeleton_->progs.xagg_switch), XDP_FLAGS_DRV_MODE, nullptr),
          "attaching XDP to " + options.interface);
  }
  ~SwitchDataplane() {
    bpf_xdp_detach(ifindex_, XDP_FLAGS_DRV_MODE, nullptr);
    xagg_switch_bpf__destroy(skeleton_);
  }
  SwitchDataplane(const SwitchDataplane&) = delete;
  SwitchDataplane& operator=(const SwitchDataplane&) = delete;

  // Empties every slot and the worker table, then activates the job.
  void start_job(xsw_config config, const std::map<uint32_t, xsw_worker>& workers) {
    set_config({});  // drop DATA while the pool is reset
    std::vector<uint32_t> keys(2 * slots_);
    std::vector<xsw_slot> empty(keys.size());
    for (uint32_t i = 0; i < keys.size(); ++i) keys[i] = i;
    uint32_t count = static_cast<uint32_t>(keys.size());
    check(bpf_map_update_batch(bpf_map__fd(skeleton_->maps.xsw_slots), keys.data(), empty.data(), &count, nullptr),
          "clearing the slot pool");
    for (uint32_t rank = 0; rank < XSW_MAX_WORKERS; ++rank) {
      auto found = workers.find(rank);
      xsw_worker entry = found == workers.end() ? xsw_worker{} : found->second;
      check(bpf_map_update_elem(bpf_map__fd(skeleton_->maps.xsw_workers), &rank, &entry, BPF_ANY),
            "registering workers");
    }
    config.slots = slots_;
    config.active = 1;
    set_config(config);
  }
  void stop_job() { set_config({}); }

  // Sums of the per-CPU counters, in enum xsw_counter order.
  std::vector<uint64_t> counters() const {
    int cpus = libbpf_num_possible_cpus();
    std::vector<uint64_t> totals(XSW_CNT_COUNT), per_cpu(cpus);
    for (uint32_t key = 0; key < XSW_CNT_COUNT; ++key) {
      if (bpf_map_lookup_elem(bpf_map__fd(skeleton_->maps.xsw_counters), &key, per_cpu.data()) != 0) continue;
      for (uint64_t value : per_cpu) totals[key] += value;
    }
    return totals;
  }

 private:
  void set_config(const xsw_config& config) {
    uint32_t zero = 0;
    check(bpf_map_update_elem(bpf_map__fd(skeleton_->maps.xsw_config_map), &zero, &config, BPF_ANY),
          "writing the job configuration");
  }

  uint32_t slots_;
  xagg_switch_bpf* skeleton_ = nullptr;
  int ifindex_ = 0;
};

struct Connection {
  UniqueFd fd;
  std::string received;
  std::optional<uint32_t> rank;
  bool left = false;
  bool closed = false;  // by the worker, after its leave
};

// The job being formed or running: the first join fixes its parameters.
struct Job {
  control::JoinRequest first;
  uint64_t token = 0;
  std::map<uint32_t, xsw_worker> workers;
  bool started = false;
};

void send_line(const Connection& connection, const control::Message& message) {
  std::string line = control::encode(message) + "\n";
  // Control lines are short; a full socket buffer means the peer is gone.
  if (::send(connection.fd.get(), line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
      static_cast<ssize_t>(line.size()))
    spdlog::warn("switch aggregator: could not send to a worker: {}", std::strerror(errno));
}

class ControlLoop {
 public:
  ControlLoop(const SwitchAggregatorOptions& options, SwitchDataplane& dataplane)
      : options_(options), dataplane_(dataplane) {
    listener_.reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    setsockopt(listener_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(options.control_port);
    if (bind(listener_.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        listen(listener_.get(), 64) != 0)
      fail(fmt::format("listening on control port {}", options.control_port));
    if (inet_pton(AF_INET, options.broadcast.c_str(), &broadcast_) != 1)
      throw std::runtime_error("bad broadcast address " + options.broadcast);
  }

  void run(int signal_fd) {
    while (true) {
      std::vector<pollfd> fds{{signal_fd, POLLIN, 0}, {listener_.get(), POLLIN, 0}};
      for (const Connection& connection : connections_) fds.push_back({connection.closed ? -1 : connection.fd.get(), POLLIN, 0});
      if (poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        fail("poll");
      }
      if (fds[0].revents) return;
      if (fds[1].revents) accept_connection();
      for (size_t i = 2; i < fds.size(); ++i)
        if (fds[i].revents && !read_from(connections_[i - 2])) {
          reset_job("a worker disconnected");
          break;
        }
      if (job_ && job_->started && all_left()) reset_job({});
    }
  }

 private:
  void accept_connection() {
    UniqueFd fd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (fd) connections_.push_back({std::move(fd), {}, {}, false});
  }

  // False when the connection closed before its leave or broke the protocol.
  bool read_from(Connection& connection) {
    char buffer[4096];
    ssize_t got = recv(connection.fd.get(), buffer, sizeof(buffer), MSG_DONTWAIT);
    if (got == 0 && connection.left) connection.closed = true;
    if (got <= 0) return connection.closed || (got < 0 && errno == EAGAIN);
    connection.received.append(buffer, static_cast<size_t>(got));
    for (size_t end; (end = connection.received.find('\n')) != std::string::npos;) {
      std::string line = connection.received.substr(0, end);
      connection.received.erase(0, end + 1);
      try {
        handle(connection, control::decode(line));
      } catch (const std::exception& error) {
        send_line(connection, control::Error{error.what()});
        return false;
      }
    }
    return connection.received.size() <= control::kMaxLineBytes;
  }

  void handle(Connection& connection, const control::Message& message) {
    if (std::holds_alternative<control::Leave>(message) && connection.rank) {
      connection.left = true;
      return;
    }
    const auto* join = std::get_if<control::JoinRequest>(&message);
    if (!join || connection.rank) throw control::ProtocolError("expected one join");
    if (join->world_size == 0 || join->world_size > XSW_MAX_WORKERS || join->rank >= join->world_size)
      throw control::ProtocolError(fmt::format("rank {} of world size {} not served", join->rank, join->world_size));
    if (!job_) {
      job_.emplace();
      job_->first = *join;
      getrandom(&job_->token, sizeof(job_->token), 0);
    } else if (job_->started || join->job_id != job_->first.job_id || join->world_size != job_->first.world_size) {
      throw control::ProtocolError("the switch aggregator serves one job at a time");
    }
    if (job_->workers.count(join->rank) != 0) throw control::ProtocolError(fmt::format("rank {} joined twice", join->rank));
    sockaddr_in peer{};
    socklen_t length = sizeof(peer);
    getpeername(connection.fd.get(), reinterpret_cast<sockaddr*>(&peer), &length);
    job_->workers[join->rank] = {peer.sin_addr.s_addr, htons(kResultPort), 1};
    connection.rank = join->rank;
    send_line(connection, control::JoinReply{job_->token, options_.data_port, kResultPort, options_.broadcast,
                                             options_.slots});
    if (job_->workers.size() == job_->first.world_size) {
      xsw_config config{};
      config.job_id = job_->first.job_id;
      config.world_size = job_->first.world_size;
      config.bcast_ip = broadcast_.s_addr;
      config.token = job_->token;
      config.result_port = htons(kResultPort);
      dataplane_.start_job(config, job_->workers);
      job_->started = true;
      for (const Connection& member : connections_)
        if (member.rank) send_line(member, control::Start{});
      spdlog::info("switch job {}: {} workers, {} slots", job_->first.job_id, job_->first.world_size, options_.slots);
    }
  }

  bool all_left() const {
    for (const Connection& connection : connections_)
      if (connection.rank && !connection.left) return false;
    return true;
  }

  // Ends the job: with a reason, the remaining workers get an error first.
  void reset_job(const std::string& reason) {
    if (!reason.empty())
      for (const Connection& connection : connections_)
        if (connection.rank && !connection.left) send_line(connection, control::Error{reason});
    dataplane_.stop_job();
    if (job_) spdlog::info("switch job {} ended{}", job_->first.job_id, reason.empty() ? "" : ": " + reason);
    job_.reset();
    connections_.clear();
  }

  const SwitchAggregatorOptions& options_;
  SwitchDataplane& dataplane_;
  UniqueFd listener_;
  in_addr broadcast_{};
  std::vector<Connection> connections_;
  std::optional<Job> job_;
};

}  // namespace

void run_switch_aggregator(const SwitchAggregatorOptions& options) {
  if (options.slots == 0 || options.slots > XSW_MAX_SLOTS)
    throw std::runtime_error(fmt::format("--slots must be 1..{}", XSW_MAX_SLOTS));
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigprocmask(SIG_BLOCK, &signals, nullptr);
  UniqueFd signal_fd(signalfd(-1, &signals, SFD_CLOEXEC));
  if (!signal_fd) fail("signalfd");

  SwitchDataplane dataplane(options);
  ControlLoop control(options, dataplane);
  spdlog::info("switch aggregator on {}: data port {}, control port {}, {} slots of {} elements", options.interface,
               options.data_port, options.control_port, options.slots, XSW_PACKET_ELEMS);
  control.run(signal_fd.get());
  std::vector<uint64_t> counters = dataplane.counters();
  spdlog::info("switch aggregator stopped: aggregated {} completed {} resent {} ignored {} rejected {} contended {}",
               counters[XSW_CNT_AGGREGATED], counters[XSW_CNT_COMPLETED], counters[XSW_CNT_RESENT],
               counters[XSW_CNT_IGNORED], counters[XSW_CNT_REJECTED], counters[XSW_CNT_CONTENDED]);
}

}  // namespace xagg::baselines::switchml
