#include "switch_aggregator.h"

#include <arpa/inet.h>
#include <fmt/format.h>
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
#include "switch_dataplane.h"
#include "unique_fd.h"

namespace xagg::baselines::switchml {
namespace {

[[noreturn]] void fail(const std::string& what, int error = errno) {
  throw std::runtime_error(fmt::format("{}: {}", what, std::strerror(error)));
}

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
  uint32_t slots = 0;  // of the pool, asked for by the first join
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
    // A join's `elements` is the slots the job asks for (the pool holds
    // slots, not a whole gradient); 0 asks for the whole pool.
    if (join->elements > UINT32_MAX) throw control::ProtocolError("a job asks for at most 2^32-1 slots");
    const uint32_t slots = join->elements != 0 ? static_cast<uint32_t>(join->elements) : options_.slots;
    if (!job_) {
      if (slots > options_.slots)
        throw control::ProtocolError(
            fmt::format("a job of {} slots does not fit this aggregator's pool of {}", slots, options_.slots));
      job_.emplace();
      job_->first = *join;
      job_->slots = slots;
      getrandom(&job_->token, sizeof(job_->token), 0);
    } else if (job_->started || join->job_id != job_->first.job_id) {
      throw control::ProtocolError("the switch aggregator serves one job at a time");
    } else if (join->world_size != job_->first.world_size || slots != job_->slots) {
      throw control::ProtocolError(
          fmt::format("job {} has world size {} and {} slots", join->job_id, job_->first.world_size, job_->slots));
    }
    if (job_->workers.count(join->rank) != 0) throw control::ProtocolError(fmt::format("rank {} joined twice", join->rank));
    sockaddr_in peer{};
    socklen_t length = sizeof(peer);
    getpeername(connection.fd.get(), reinterpret_cast<sockaddr*>(&peer), &length);
    job_->workers[join->rank] = {peer.sin_addr.s_addr, htons(kResultPort), 1};
    connection.rank = join->rank;
    send_line(connection,
              control::JoinReply{job_->token, options_.data_port, kResultPort, options_.broadcast});
    if (job_->workers.size() == job_->first.world_size) {
      xsw_config config{};
      config.job_id = job_->first.job_id;
      config.world_size = job_->first.world_size;
      config.bcast_ip = broadcast_.s_addr;
      config.token = job_->token;
      config.result_port = htons(kResultPort);
      config.slots = job_->slots;
      dataplane_.start_job(config, job_->workers);
      job_->started = true;
      for (const Connection& member : connections_)
        if (member.rank) send_line(member, control::Start{join->mtu, 0, job_->slots});
      spdlog::info("switch job {}: {} workers, {} slots", job_->first.job_id, job_->first.world_size, job_->slots);
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

  SwitchDataplane dataplane(options.data_port, options.slots);
  dataplane.attach(options.interface);
  ControlLoop control(options, dataplane);
  spdlog::info("switch aggregator on {}: data port {}, control port {}, a pool of {} slots of up to {} elements",
               options.interface, options.data_port, options.control_port, options.slots, XSW_MAX_PACKET_ELEMS);
  control.run(signal_fd.get());
  std::vector<uint64_t> counters = dataplane.counters();
  spdlog::info(
      "switch aggregator stopped: aggregated {} completed {} resent {} ignored {} rejected {} contended {} "
      "length_mismatch {}",
      counters[XSW_CNT_AGGREGATED], counters[XSW_CNT_COMPLETED], counters[XSW_CNT_RESENT], counters[XSW_CNT_IGNORED],
      counters[XSW_CNT_REJECTED], counters[XSW_CNT_CONTENDED], counters[XSW_CNT_LENGTH_MISMATCH]);
}

}  // namespace xagg::baselines::switchml
