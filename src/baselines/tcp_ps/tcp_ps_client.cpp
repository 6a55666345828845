#include "baselines/tcp_ps/tcp_ps_client.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <numeric>
#include <set>
#include <stdexcept>

#include "baselines/tcp_ps/socket_util.h"
#include "inet.h"

namespace xagg::baselines {

using namespace tcp_ps;
using Clock = std::chrono::steady_clock;

namespace {

// A server's error or a broken connection; the caller names the server and
// the call when it turns this into a CommError.
struct ServerFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Non-blocking transfer of up to `bytes`; returns how many moved (0 when the
// socket would block).
size_t send_some(int fd, const char* data, size_t bytes) {
  ssize_t sent = ::send(fd, data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (sent >= 0) return static_cast<size_t>(sent);
  if (errno == EAGAIN || errno == EINTR) return 0;
  throw ServerFailure(fmt::format("sending: {}", std::strerror(errno)));
}

size_t recv_some(int fd, char* data, size_t bytes) {
  ssize_t got = ::recv(fd, data, bytes, MSG_DONTWAIT);
  if (got > 0) return static_cast<size_t>(got);
  if (got == 0) throw ServerFailure("the server closed the connection");
  if (errno == EAGAIN || errno == EINTR) return 0;
  throw ServerFailure(fmt::format("receiving: {}", std::strerror(errno)));
}

// Reads exactly `bytes` before the deadline; false on timeout.
bool recv_before(int fd, void* data, size_t bytes, Clock::time_point deadline) {
  auto* next = static_cast<char*>(data);
  for (size_t got = 0; got < bytes; got += recv_some(fd, next + got, bytes - got))
    if (poll_until(fd, POLLIN, deadline) == 0) return false;
  return true;
}

// The message that follows an Error frame header or a refused hello, as much
// of it as arrives before the deadline or the close that follows it.
std::string recv_reason(int fd, uint32_t bytes, Clock::time_point deadline) {
  std::string reason(std::min(bytes, kMaxMessageBytes), '\0');
  size_t got = 0;
  try {
    while (got < reason.size() && poll_until(fd, POLLIN, deadline) != 0)
      got += recv_some(fd, reason.data() + got, reason.size() - got);
  } catch (const ServerFailure&) {
  }
  reason.resize(got);
  return reason;
}

// Polls until an entry has an event (entries with a negative fd are skipped);
// false at the deadline.
bool poll_before(std::vector<pollfd>& entries, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    const int ready = ::poll(entries.data(), entries.size(), static_cast<int>(std::clamp<long long>(left, 0, INT_MAX)));
    if (ready > 0) return true;
    if (ready == 0 && Clock::now() >= deadline) return false;
    if (ready < 0 && errno != EINTR) throw_errno("tcp-ps: poll");
  }
}

// One server's piece of an all-reduce on its non-blocking socket: the
// request and the floats go out while Result frames overwrite the piece in
// place, never ahead of what has been pushed.
class PieceExchange {
 public:
  PieceExchange(size_t server, int fd, uint64_t iteration, float* piece, size_t count, size_t offset)
      : server_(server),
        fd_(fd),
        request_{iteration, count},
        bytes_(reinterpret_cast<char*>(piece)),
        size_(count * sizeof(float)),
        offset_(offset * sizeof(float)) {}

  size_t server() const { return server_; }
  bool done() const { return results_received_ == size_; }
  // Entry for poll(); a finished piece's is skipped, its socket holds no more of this call.
  pollfd poll_entry() const {
    return {done() ? -1 : fd_, static_cast<short>(POLLIN | (data_sent_ < size_ ? POLLOUT : 0)), 0};
  }

  // Moves what the socket allows; throws ServerFailure.
  void advance(short revents, Clock::time_point deadline) {
    if (revents & POLLOUT) push();
    if (revents & (POLLIN | POLLHUP | POLLERR)) receive(deadline);
  }

  // What is still outstanding, in bytes of the whole tensor.
  std::string progress() const {
    return fmt::format("pushed {} of {} bytes, results missing for bytes [{}, {})", data_sent_, size_,
                       offset_ + results_received_, offset_ + size_);
  }

 private:
  void push() {
    if (request_sent_ < sizeof(request_))
      request_sent_ +=
          send_some(fd_, reinterpret_cast<const char*>(&request_) + request_sent_, sizeof(request_) - request_sent_);
    if (request_sent_ == sizeof(request_)) data_sent_ += send_some(fd_, bytes_ + data_sent_, size_ - data_sent_);
  }

  // Drains what has arrived; frames after this piece belong to later calls.
  void receive(Clock::time_point deadline) {
    while (!done()) {
      if (header_received_ < sizeof(header_)) {
        const size_t got = recv_some(fd_, reinterpret_cast<char*>(&header_) + header_received_,
                                     sizeof(header_) - header_received_);
        header_received_ += got;
        if (header_received_ < sizeof(header_)) {
          if (got == 0) return;
          continue;
        }
        if (header_.type == FrameType::Error)
          throw ServerFailure(fmt::format("server error: {}", recv_reason(fd_, header_.payload_bytes, deadline)));
        if (header_.type != FrameType::Result || header_.payload_bytes == 0 ||
            results_received_ + header_.payload_bytes > data_sent_)
          throw ServerFailure("malformed frame from the server");
        payload_left_ = header_.payload_bytes;
      }
      const size_t got = recv_some(fd_, bytes_ + results_received_, payload_left_);
      results_received_ += got;
      payload_left_ -= got;
      if (payload_left_ == 0) header_received_ = 0;
      if (got == 0) return;
    }
  }

  const size_t server_;
  const int fd_;
  const Request request_;
  char* const bytes_;
  const size_t size_;    // bytes of the piece
  const size_t offset_;  // of the piece in the tensor, in bytes
  size_t request_sent_ = 0, data_sent_ = 0;
  size_t results_received_ = 0;
  FrameHeader header_;
  size_t header_received_ = 0, payload_left_ = 0;
};

}  // namespace

std::vector<size_t> tcp_ps::split_by_weight(uint64_t count, std::span<const uint32_t> weights) {
  const uint64_t total = std::accumulate(weights.begin(), weights.end(), uint64_t{0});
  std::vector<size_t> sizes(weights.size());
  std::vector<uint64_t> remainders(weights.size());
  uint64_t assigned = 0;
  for (size_t server = 0; server < weights.size(); ++server) {
    const unsigned __int128 share = static_cast<unsigned __int128>(count) * weights[server];  // exact
    sizes[server] = static_cast<size_t>(share / total);
    remainders[server] = static_cast<uint64_t>(share % total);
    assigned += sizes[server];
  }
  // Rounding down leaves fewer elements than servers; one each to the largest remainders.
  std::vector<size_t> by_remainder(weights.size());
  std::iota(by_remainder.begin(), by_remainder.end(), size_t{0});
  std::stable_sort(by_remainder.begin(), by_remainder.end(),
                   [&](size_t a, size_t b) { return remainders[a] > remainders[b]; });
  for (uint64_t i = 0; i < count - assigned; ++i) ++sizes[by_remainder[i]];
  return sizes;
}

TcpPsClient::TcpPsClient(TcpPsClientConfig config) : config_(std::move(config)) {
  if (config_.world_size == 0 || config_.rank >= config_.world_size)
    throw ConfigError(fmt::format("tcp-ps: rank {} outside world size {}", config_.rank, config_.world_size));
  if (config_.servers.empty()) throw ConfigError("tcp-ps: no servers configured");
  if (config_.servers.size() > kMaxServers)
    throw ConfigError(fmt::format("tcp-ps: {} servers configured, at most {}", config_.servers.size(), kMaxServers));
  if (config_.weights.empty()) config_.weights.assign(config_.servers.size(), 1);
  if (config_.weights.size() != config_.servers.size())
    throw ConfigError(
        fmt::format("tcp-ps: {} server weights for {} servers", config_.weights.size(), config_.servers.size()));
  std::set<in_addr_t> listed;
  for (size_t i = 0; i < config_.servers.size(); ++i) {
    const std::string& server = config_.servers[i];
    if (config_.weights[i] == 0) throw ConfigError(fmt::format("tcp-ps: server {} ({}) has weight 0", i, server));
    const sockaddr_in address = make_address(server, config_.port);
    // The same server twice would see this rank join its job twice.
    if (!listed.insert(address.sin_addr.s_addr).second)
      throw ConfigError(fmt::format("tcp-ps: server {} listed twice", server));
    servers_.push_back({fmt::format("{}:{}", server, config_.port), address, {}});
  }
  join();
}

void TcpPsClient::join() {
  const auto deadline = Clock::now() + config_.join_timeout;
  // A piece never exceeds the whole tensor, so every server gets the job's maximum.
  const Hello hello{kMagic, config_.rank, config_.world_size, 0, config_.max_elements};
  // Every hello goes out before any reply is awaited: a server answers once
  // every rank has joined it, so the servers gather their jobs concurrently.
  for (auto& server : servers_) {
    // Buffers are set before connect, so the window scale covers them.
    server.fd = connect_before("the tcp-ps server", server.address, deadline,
                               [&](int fd) { tune_socket(fd, config_.socket_buffer_bytes); });
    if (!send_all(server.fd.get(), &hello, sizeof(hello)))
      throw_errno(fmt::format("tcp-ps: sending hello to {}", server.name));
  }
  for (auto& server : servers_) {
    const int fd = server.fd.get();
    HelloReply reply;
    try {
      if (!recv_before(fd, &reply, sizeof(reply), deadline))
        throw TimeoutError(
            fmt::format("tcp-ps: rank {} timed out after {} ms waiting for {} to start the job of {} ranks",
                        config_.rank, config_.join_timeout.count(), server.name, config_.world_size));
    } catch (const ServerFailure& failure) {
      throw CommError(fmt::format("tcp-ps: rank {} joining {}: {}", config_.rank, server.name, failure.what()));
    }
    if (reply.magic != kMagic) throw CommError(fmt::format("tcp-ps: {} is not a tcp-ps server", server.name));
    if (reply.status != HelloStatus::Accepted)
      throw ConfigError(fmt::format("tcp-ps: {} refused rank {}: {}", server.name, config_.rank,
                                    recv_reason(fd, reply.message_bytes, deadline)));
  }
}

void TcpPsClient::allreduce(float* data, size_t count, ReduceOp op) {
  if (broken_) throw CommError("tcp-ps: a connection failed in an earlier all-reduce");
  if (op != ReduceOp::Sum && op != ReduceOp::Average) throw ConfigError("tcp-ps: only sum and average all-reduces");
  if (count > config_.max_elements)
    throw ConfigError(fmt::format("tcp-ps: {} elements exceed max_elements {}", count, config_.max_elements));
  if (count == 0) return;
  broken_ = true;  // until this all-reduce completes: the streams are out of step after any exception
  const uint64_t call = allreduce_calls_++;
  const auto deadline = Clock::now() + config_.operation_timeout;

  std::vector<PieceExchange> pieces;
  pieces.reserve(servers_.size());
  const std::vector<size_t> sizes = split_by_weight(count, config_.weights);
  for (size_t server = 0, offset = 0; server < servers_.size(); offset += sizes[server++]) {
    if (sizes[server] == 0) continue;  // every rank computes the same split, so all skip this server
    ServerConnection& connection = servers_[server];
    pieces.emplace_back(server, connection.fd.get(), connection.next_iteration++, data + offset, sizes[server], offset);
  }

  std::vector<pollfd> entries(pieces.size());
  while (std::any_of(pieces.begin(), pieces.end(), [](const PieceExchange& piece) { return !piece.done(); })) {
    std::transform(pieces.begin(), pieces.end(), entries.begin(), [](auto& piece) { return piece.poll_entry(); });
    if (!poll_before(entries, deadline)) {
      std::vector<std::string> missing;
      for (const auto& piece : pieces)
        if (!piece.done()) missing.push_back(fmt::format("{} {}", servers_[piece.server()].name, piece.progress()));
      for (auto& server : servers_) server.fd.reset();  // the servers see it and fail the job for the other ranks
      throw TimeoutError(fmt::format("tcp-ps: rank {} all-reduce #{} of {} floats timed out after {} ms: {}",
                                     config_.rank, call, count, config_.operation_timeout.count(),
                                     fmt::join(missing, "; ")));
    }
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (entries[i].revents == 0) continue;
      try {
        pieces[i].advance(entries[i].revents, deadline);
      } catch (const ServerFailure& failure) {
        throw CommError(fmt::format("tcp-ps: rank {} all-reduce #{}: server {}: {}", config_.rank, call,
                                    servers_[pieces[i].server()].name, failure.what()));
      }
    }
  }

  if (op == ReduceOp::Average) {
    const auto world_size = static_cast<float>(config_.world_size);
    for (size_t i = 0; i < count; ++i) data[i] /= world_size;
  }
  broken_ = false;
}

}  // namespace xagg::baselines
