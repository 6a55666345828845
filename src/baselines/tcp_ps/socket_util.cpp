#include "socket_util.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "xagg/errors.h"

namespace xagg::baselines::tcp_ps {

void throw_errno(const std::string& what) { throw CommError(fmt::format("{}: {}", what, std::strerror(errno))); }

sockaddr_in make_address(const std::string& ipv4, uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  if (inet_pton(AF_INET, ipv4.c_str(), &address.sin_addr) != 1)
    throw ConfigError(fmt::format("'{}' is not an IPv4 address", ipv4));
  return address;
}

void tune_socket(int fd, int buffer_bytes) {
  int on = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on)) != 0) throw_errno("setting TCP_NODELAY");
  if (buffer_bytes <= 0) return;
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes)) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes)) != 0)
    throw_errno("setting socket buffer sizes");
}

bool send_all(int fd, const void* data, size_t bytes, int flags) {
  auto* next = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t sent = ::send(fd, next, bytes, flags | MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    next += sent;
    bytes -= static_cast<size_t>(sent);
  }
  return true;
}

bool recv_all(int fd, void* data, size_t bytes) {
  auto* next = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t got = ::recv(fd, next, bytes, MSG_WAITALL);
    if (got < 0 && errno == EINTR) continue;
    if (got == 0) errno = 0;
    if (got <= 0) return false;
    next += got;
    bytes -= static_cast<size_t>(got);
  }
  return true;
}

}  // namespace xagg::baselines::tcp_ps
