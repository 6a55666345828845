#include "baselines/tcp_ps/tcp_ps_client.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <string_view>

#include "baselines/tcp_ps/socket_util.h"
#include "inet.h"

namespace xagg::baselines {

using namespace tcp_ps;
using Clock = std::chrono::steady_clock;

namespace {

// Non-blocking transfer of up to `bytes`; returns how many moved (0 when the
// socket would block). Throws CommError when the peer closed or the socket failed.
size_t send_some(int fd, const char* data, size_t bytes) {
  ssize_t sent = ::send(fd, data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (sent >= 0) return static_cast<size_t>(sent);
  if (errno == EAGAIN || errno == EINTR) return 0;
  throw_errno("tcp-ps: sending to the server");
}

size_t recv_some(int fd, char* data, size_t bytes) {
  ssize_t got = ::recv(fd, data, bytes, MSG_DONTWAIT);
  if (got > 0) return static_cast<size_t>(got);
  if (got == 0) throw CommError("tcp-ps: the server closed the connection");
  if (errno == EAGAIN || errno == EINTR) return 0;
  throw_errno("tcp-ps: receiving from the server");
}

// Reads exactly `bytes` before the deadline; false on timeout.
bool recv_before(int fd, void* data, size_t bytes, Clock::time_point deadline) {
  auto* next = static_cast<char*>(data);
  for (size_t got = 0; got < bytes; got += recv_some(fd, next + got, bytes - got))
    if (poll_until(fd, POLLIN, deadline) == 0) return false;
  return true;
}

}  // namespace

TcpPsClient::TcpPsClient(TcpPsClientConfig config) : config_(std::move(config)) {
  if (config_.world_size == 0 || config_.rank >= config_.world_size)
    throw ConfigError(fmt::format("tcp-ps: rank {} outside world size {}", config_.rank, config_.world_size));
  join();
}

void TcpPsClient::join() {
  const auto deadline = Clock::now() + config_.join_timeout;
  sockaddr_in address = make_address(config_.server, config_.port);
  const std::string server = fmt::format("{}:{}", config_.server, config_.port);
  // Buffers are set before connect, so the window scale covers them.
  fd_ = connect_before("the tcp-ps server", address, deadline,
                       [&](int fd) { tune_socket(fd, config_.socket_buffer_bytes); });

  Hello hello{kMagic, config_.rank, config_.world_size, 0, config_.max_elements};
  if (!send_all(fd_.get(), &hello, sizeof(hello))) throw_errno(fmt::format("tcp-ps: sending hello to {}", server));
  HelloReply reply;
  if (!recv_before(fd_.get(), &reply, sizeof(reply), deadline))
    throw TimeoutError(fmt::format("tcp-ps: rank {} timed out after {} ms waiting for {} to start the job of {} ranks",
                                   config_.rank, config_.join_timeout.count(), server, config_.world_size));
  if (reply.magic != kMagic) throw CommError(fmt::format("tcp-ps: {} is not a tcp-ps server", server));
  if (reply.status != HelloStatus::Accepted) {
    std::string reason(std::min(reply.message_bytes, kMaxMessageBytes), '\0');
    recv_before(fd_.get(), reason.data(), reason.size(), deadline);
    throw ConfigError(fmt::format("tcp-ps: {} refused rank {}: {}", server, config_.rank, reason));
  }
}

void TcpPsClient::allreduce(float* data, size_t count, ReduceOp op) {
  if (broken_) throw CommError("tcp-ps: the connection failed in an earlier all-reduce");
  if (count > config_.max_elements)
    throw ConfigError(fmt::format("tcp-ps: {} elements exceed max_elements {}", count, config_.max_elements));
  if (count == 0) return;
  broken_ = true;  // until this all-reduce completes: the stream is out of step after any exception
  const uint64_t iteration = iteration_++;
  const auto deadline = Clock::now() + config_.operation_timeout;
  const int fd = fd_.get();

  const Request request{iteration, count};
  const size_t data_bytes = count * sizeof(float);
  auto* bytes = reinterpret_cast<char*>(data);
  size_t request_sent = 0, data_sent = 0;
  size_t results_received = 0;  // results overwrite data only behind data_sent

  FrameHeader header;
  size_t header_received = 0, payload_left = 0;

  while (data_sent < data_bytes || results_received < data_bytes) {
    const short events = poll_until(fd, POLLIN | (data_sent < data_bytes ? POLLOUT : 0), deadline);
    if (events == 0) {
      fd_.reset();  // the server sees the disconnect and fails the job for the other ranks
      throw TimeoutError(fmt::format(
          "tcp-ps: rank {} all-reduce #{} of {} floats timed out after {} ms: pushed {} of {} bytes, results missing "
          "for bytes [{}, {})",
          config_.rank, iteration, count, config_.operation_timeout.count(), data_sent, data_bytes, results_received,
          data_bytes));
    }
    if (events & POLLOUT) {
      if (request_sent < sizeof(request))
        request_sent +=
            send_some(fd, reinterpret_cast<const char*>(&request) + request_sent, sizeof(request) - request_sent);
      if (request_sent == sizeof(request)) data_sent += send_some(fd, bytes + data_sent, data_bytes - data_sent);
    }
    if (!(events & (POLLIN | POLLHUP | POLLERR))) continue;
    while (results_received < data_bytes) {  // drain what has arrived; frames after it belong to later calls
      size_t got;
      if (header_received < sizeof(header)) {
        got = recv_some(fd, reinterpret_cast<char*>(&header) + header_received, sizeof(header) - header_received);
        header_received += got;
        if (header_received < sizeof(header)) {
          if (got == 0) break;
          continue;
        }
        if (header.type == FrameType::Error) {
          std::string reason(std::min(header.payload_bytes, kMaxMessageBytes), '\0');
          recv_before(fd, reason.data(), reason.size(), deadline);
          throw CommError(
              fmt::format("tcp-ps: rank {} all-reduce #{}: server error: {}", config_.rank, iteration, reason));
        }
        if (header.type != FrameType::Result || header.payload_bytes == 0 ||
            results_received + header.payload_bytes > data_sent)
          throw CommError(fmt::format("tcp-ps: malformed frame from the server in all-reduce #{}", iteration));
        payload_left = header.payload_bytes;
      }
      got = recv_some(fd, bytes + results_received, payload_left);
      results_received += got;
      payload_left -= got;
      if (payload_left == 0) header_received = 0;
      if (got == 0) break;
    }
  }

  if (op == ReduceOp::Average) {
    const auto world_size = static_cast<float>(config_.world_size);
    for (size_t i = 0; i < count; ++i) data[i] /= world_size;
  }
  broken_ = false;
}

}  // namespace xagg::baselines
