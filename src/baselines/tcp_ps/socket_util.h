// Socket helpers shared by the parameter-server baseline's server and client.
#pragma once

#include <netinet/in.h>

#include <cstddef>
#include <string>

#include "unique_fd.h"

namespace xagg::baselines::tcp_ps {

using xagg::UniqueFd;

// Throws CommError "<what>: <strerror(errno)>".
[[noreturn]] void throw_errno(const std::string& what);

// IPv4 address and port; throws ConfigError on a malformed address.
sockaddr_in make_address(const std::string& ipv4, uint16_t port);

// TCP_NODELAY and, when buffer_bytes > 0, fixed SO_SNDBUF/SO_RCVBUF (0 keeps
// the kernel's autotuning).
void tune_socket(int fd, int buffer_bytes);

// Blocking transfers of exactly `bytes`; false when the peer closed or the
// socket failed (errno says why, 0 for an orderly close).
bool send_all(int fd, const void* data, size_t bytes, int flags = 0);
bool recv_all(int fd, void* data, size_t bytes);

}  // namespace xagg::baselines::tcp_ps
