#include "control_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "xagg/communicator.h"

namespace xagg::worker {
namespace {

int milliseconds_until(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1'000'000));
}

// Waits for events on fd until the deadline; false on timeout.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd entry{fd, events, 0};
    int ready = ::poll(&entry, 1, milliseconds_until(deadline));
    if (ready > 0) return true;
    if (ready == 0) {
      if (Clock::now() >= deadline) return false;
      continue;
    }
    if (errno != EINTR) throw CommError(fmt::format("poll on control connection: {}", std::strerror(errno)));
  }
}

}  // namespace

std::string to_string(const sockaddr_in& address) {
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &address.sin_addr, text, sizeof(text));
  return fmt::format("{}:{}", text, ntohs(address.sin_port));
}

ControlChannel::ControlChannel(const sockaddr_in& aggregator, Clock::time_point deadline)
    : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)), peer_(aggregator) {
  if (!fd_) throw CommError(fmt::format("control socket: {}", std::strerror(errno)));
  int one = 1;
  ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(fd_.get(), reinterpret_cast<const sockaddr*>(&peer_), sizeof(peer_)) != 0) {
    if (errno != EINPROGRESS)
      throw CommError(fmt::format("connect to aggregator {}: {}", to_string(peer_), std::strerror(errno)));
    if (!wait_for(fd_.get(), POLLOUT, deadline))
      throw TimeoutError(fmt::format("connect to aggregator {}: timed out", to_string(peer_)));
    int error = 0;
    socklen_t length = sizeof(error);
    ::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &error, &length);
    if (error != 0)
      throw CommError(fmt::format("connect to aggregator {}: {}", to_string(peer_), std::strerror(error)));
  }
}

void ControlChannel::send(const control::Message& message, Clock::time_point deadline) {
  std::string line = control::encode(message) + "\n";
  size_t sent = 0;
  while (sent < line.size()) {
    ssize_t written = ::send(fd_.get(), line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (written >= 0) {
      sent += static_cast<size_t>(written);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(fd_.get(), POLLOUT, deadline))
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

std::optional<control::Message> ControlChannel::receive(Clock::time_point deadline) {
  for (;;) {
    if (auto message = take_buffered_line()) return message;
    if (!wait_for(fd_.get(), POLLIN, deadline)) return std::nullopt;
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

}  // namespace xagg::worker
