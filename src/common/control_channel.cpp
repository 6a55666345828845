#include "control_channel.h"

#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "inet.h"
#include "peer_liveness.h"
#include "xagg/errors.h"

namespace xagg {

// Thin-stream timeouts: the connection carries a line now and then, so a
// lost segment is repaired by the retransmission timer, and linear timeouts
// retry it every RTO instead of after 0.2, 0.4, 0.8 s: a loss costs the
// heartbeats less silence (peer_liveness.h). The aggregator sets it too.
ControlChannel::ControlChannel(const sockaddr_in& aggregator, Clock::time_point deadline)
    : fd_(connect_before("the aggregator", aggregator, deadline,
                         [](int fd) {
                           int one = 1;
                           ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                           ::setsockopt(fd, IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, &one, sizeof(one));
                         })),
      peer_(aggregator) {}

void ControlChannel::send(const control::Message& message, Clock::time_point deadline) {
  std::string line = control::encode(message) + "\n";
  std::lock_guard lock(send_mutex_);
  size_t sent = 0;
  while (sent < line.size()) {
    ssize_t written = ::send(fd_.get(), line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (written >= 0) {
      sent += static_cast<size_t>(written);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (poll_until(fd_.get(), POLLOUT, deadline) == 0)
        throw TimeoutError(fmt::format("send to aggregator {}: timed out", to_string(peer_)));
    } else if (errno != EINTR) {
      throw CommError(fmt::format("send to aggregator {}: {}", to_string(peer_), std::strerror(errno)));
    }
  }
}

std::optional<control::Message> ControlChannel::take_buffered_line() {
  size_t end = received_.find('\n');
  if (end == std::string::npos) {
    if (received_.size() > control::kMaxLineBytes)
      throw CommError(fmt::format("aggregator {} sent a control line over {} bytes", to_string(peer_),
                                  control::kMaxLineBytes));
    return std::nullopt;
  }
  std::string line = received_.substr(0, end);
  received_.erase(0, end + 1);
  try {
    return control::decode(line);
  } catch (const control::ProtocolError& error) {
    throw CommError(fmt::format("malformed control message from aggregator {}: {}", to_string(peer_), error.what()));
  }
}

in_addr ControlChannel::local_address() const {
  sockaddr_in local{};
  socklen_t length = sizeof(local);
  if (::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&local), &length) != 0)
    throw CommError(fmt::format("getsockname: {}", std::strerror(errno)));
  return local.sin_addr;
}

TcpProgress ControlChannel::tcp_progress() const { return read_tcp_progress(fd_.get()); }

std::optional<control::Message> ControlChannel::receive(Clock::time_point deadline) {
  for (;;) {
    if (auto message = take_buffered_line()) return message;
    if (poll_until(fd_.get(), POLLIN, deadline) == 0) return std::nullopt;
    char buffer[4096];
    ssize_t count = ::recv(fd_.get(), buffer, sizeof(buffer), 0);
    if (count > 0) {
      received_.append(buffer, static_cast<size_t>(count));
    } else if (count == 0) {
      throw CommError(fmt::format("aggregator {} closed the control connection", to_string(peer_)));
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      throw CommError(fmt::format("receive from aggregator {}: {}", to_string(peer_), std::strerror(errno)));
    }
  }
}

}  // namespace xagg
