#include "udp_transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "control_channel.h"
#include "inet.h"
#include "xagg/errors.h"

namespace xagg::worker {
namespace {

using wire::kReceiveSlotBytes;
// A datagram is charged to the socket until its qdisc sends it, so a small
// send buffer makes a shaped link (tbf) block the sender instead of dropping
// what overflows the qdisc; unshaped veth frees datagrams at once. The
// kernel doubles the value: 1 MiB, about 60 datagrams of 8 KB (their
// buffers count, not only their bytes), 1 ms at 4 Gbit/s.
constexpr size_t kSendBufferBytes = 512 * 1024;

// Transient conditions of a non-blocking UDP socket; the retransmission path
// recovers from all of them.
bool is_transient(int error) {
  return error == EAGAIN || error == EWOULDBLOCK || error == EINTR || error == ENOBUFS;
}

std::atomic<bool> receive_buffer_warned{false};
std::atomic<bool> send_buffer_warned{false};

// Root may exceed net.core.{r,w}mem_max (`limit`) with the *FORCE options;
// otherwise the kernel silently clamps the size to it, so the size granted is
// read back (Linux reports double the size set). One warning per process and
// buffer, not one per communicator.
void set_buffer(int fd, int force_option, int option, size_t bytes, const char* name, const char* limit,
                std::atomic<bool>& warned) {
  int value = static_cast<int>(std::min<size_t>(bytes, INT32_MAX / 2));
  if (::setsockopt(fd, SOL_SOCKET, force_option, &value, sizeof(value)) != 0 &&
      ::setsockopt(fd, SOL_SOCKET, option, &value, sizeof(value)) != 0) {
    spdlog::warn("xagg: setting {} to {} bytes failed: {}", name, value, std::strerror(errno));
    return;
  }
  int granted = 0;
  socklen_t length = sizeof(granted);
  if (::getsockopt(fd, SOL_SOCKET, option, &granted, &length) != 0 || granted / 2 >= value) return;
  if (!warned.exchange(true))
    spdlog::warn("xagg: {} is {} bytes instead of the {} requested: raise net.core.{} to at least {} (or run "
                 "with CAP_NET_ADMIN)",
                 name, granted / 2, value, limit, value);
}

UniqueFd bound_socket(uint16_t local_port, size_t receive_buffer_bytes) {
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) throw CommError(fmt::format("UDP socket: {}", std::strerror(errno)));
  set_buffer(fd.get(), SO_RCVBUFFORCE, SO_RCVBUF, receive_buffer_bytes, "SO_RCVBUF", "rmem_max",
             receive_buffer_warned);
  set_buffer(fd.get(), SO_SNDBUFFORCE, SO_SNDBUF, kSendBufferBytes, "SO_SNDBUF", "wmem_max", send_buffer_warned);
  // Never fragment: the aggregator drops IP fragments, so on a link whose MTU
  // is too small a send must fail with EMSGSIZE rather than time out.
  int no_fragments = IP_PMTUDISC_DO;
  ::setsockopt(fd.get(), IPPROTO_IP, IP_MTU_DISCOVER, &no_fragments, sizeof(no_fragments));
  // DATA goes out ECN-capable, ECT(0): a congested hop marks CE instead of
  // dropping, the aggregator echoes it in the RESULT and the congestion window
  // reacts (congestion_window.h). A failure leaves packets Not-ECT: loss and
  // delay still work.
  int ecn_capable = wire::kEcnEct0;
  if (::setsockopt(fd.get(), IPPROTO_IP, IP_TOS, &ecn_capable, sizeof(ecn_capable)) != 0)
    spdlog::warn("xagg: setting ECT(0) on the UDP socket: {}", std::strerror(errno));
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = htonl(INADDR_ANY);
  local.sin_port = htons(local_port);
  // No SO_REUSEADDR: a second rank of the job on this host would share the
  // port, and a result resent to one rank could reach the other.
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&local), sizeof(local)) != 0)
    throw CommError(fmt::format("bind UDP 0.0.0.0:{}: {}{}", local_port, std::strerror(errno),
                                errno == EADDRINUSE ? " (another rank of the job on this host, or a rank of another job "
                                                      "whose aggregators gave it this result port? ranks on one host "
                                                      "need distinct result ports, docs/protocol.md sections 2 and 6)"
                                                    : ""));
  return fd;
}

// Joins the aggregator's RESULT group on the interface that leads to the
// aggregator, where its RESULTs arrive: the kernel sends the IGMP report.
void join_group(int fd, in_addr group, const sockaddr_in& aggregator) {
  UniqueFd probe(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in local{};
  socklen_t length = sizeof(local);
  // Connecting a UDP socket sends nothing: it picks the route and the local address.
  if (!probe || ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&aggregator), sizeof(aggregator)) != 0 ||
      ::getsockname(probe.get(), reinterpret_cast<sockaddr*>(&local), &length) != 0)
    throw CommError(fmt::format("finding the interface towards aggregator {}: {}", to_string(aggregator),
                                std::strerror(errno)));
  ip_mreqn request{};
  request.imr_multiaddr = group;
  request.imr_address = local.sin_addr;
  // Two aggregators of the job may multicast to one group: joined once is enough.
  if (::setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &request, sizeof(request)) != 0 && errno != EADDRINUSE)
    throw CommError(fmt::format("joining multicast group {} on {} for aggregator {}'s RESULTs: {}", to_string(group),
                                to_string(local.sin_addr), to_string(aggregator), std::strerror(errno)));
}

}  // namespace

UdpTransport::UdpTransport(std::vector<Aggregator> aggregators, size_t receive_buffer_bytes)
    : aggregators_(std::move(aggregators)), receive_buffers_(kBatch * kReceiveSlotBytes) {
  std::vector<uint16_t> ports;
  for (const Aggregator& aggregator : aggregators_) {
    // Results are told apart by their source: two aggregators must not share one.
    for (const Aggregator& earlier : aggregators_) {
      if (&earlier == &aggregator) break;
      if (earlier.data.sin_addr.s_addr == aggregator.data.sin_addr.s_addr &&
          earlier.data.sin_port == aggregator.data.sin_port)
        throw CommError(fmt::format("aggregators {} and {} share the data address {}", earlier.name, aggregator.name,
                                    to_string(aggregator.data)));
    }
    auto known = std::ranges::find(ports, aggregator.result_port);
    if (known == ports.end()) {
      sockets_.push_back(bound_socket(aggregator.result_port, receive_buffer_bytes));
      ports.push_back(aggregator.result_port);
      known = ports.end() - 1;
    }
    socket_of_.push_back(static_cast<uint32_t>(known - ports.begin()));
    if (aggregator.group) join_group(sockets_[socket_of_.back()].get(), *aggregator.group, aggregator.data);
  }
}

size_t UdpTransport::send(std::span<const Outgoing> packets) {
  blocked_socket_.reset();
  size_t total = 0;
  while (total < packets.size()) {
    // One sendmmsg per run of packets that leave through the same socket.
    const uint32_t socket = socket_of_[packets[total].shard];
    iovec vectors[kBatch];
    mmsghdr messages[kBatch] = {};
    size_t count = 0;
    for (; count < kBatch && total + count < packets.size() && socket_of_[packets[total + count].shard] == socket;
         ++count) {
      const Outgoing& outgoing = packets[total + count];
      vectors[count] = {const_cast<std::byte*>(outgoing.packet.data()), outgoing.packet.size()};
      messages[count].msg_hdr.msg_iov = &vectors[count];
      messages[count].msg_hdr.msg_iovlen = 1;
      messages[count].msg_hdr.msg_name = &aggregators_[outgoing.shard].data;
      messages[count].msg_hdr.msg_namelen = sizeof(sockaddr_in);
    }
    int sent = ::sendmmsg(sockets_[socket].get(), messages, static_cast<unsigned>(count), MSG_DONTWAIT);
    if (sent < 0) {
      if (is_transient(errno)) {
        blocked_socket_ = socket;
        return total;
      }
      // The job's packets fit the MTU its ranks agreed on at join: a link's MTU fell since.
      if (errno == EMSGSIZE)
        throw CommError(fmt::format("sendmmsg: a {}-byte datagram exceeds the path MTU; the job's packets need an MTU "
                                    "of {}, agreed at join: a link's MTU has been lowered since (docs/protocol.md, "
                                    "section 1)",
                                    packets[total].packet.size(), packets[total].packet.size() + wire::kIpUdpBytes));
      throw CommError(fmt::format("sendmmsg: {}", std::strerror(errno)));
    }
    total += static_cast<size_t>(sent);
    if (static_cast<size_t>(sent) < count) {
      blocked_socket_ = socket;
      return total;
    }
  }
  return total;
}

bool UdpTransport::receive(const std::function<void(std::span<const std::byte>, uint32_t shard)>& handle) {
  bool more = false;
  for (uint32_t socket = 0; socket < sockets_.size(); ++socket) {
    iovec vectors[kBatch];
    sockaddr_in senders[kBatch];
    mmsghdr messages[kBatch] = {};
    for (size_t i = 0; i < kBatch; ++i) {
      vectors[i] = {receive_buffers_.data() + i * kReceiveSlotBytes, kReceiveSlotBytes};
      messages[i].msg_hdr.msg_iov = &vectors[i];
      messages[i].msg_hdr.msg_iovlen = 1;
      messages[i].msg_hdr.msg_name = &senders[i];
      messages[i].msg_hdr.msg_namelen = sizeof(senders[i]);
    }
    int received = ::recvmmsg(sockets_[socket].get(), messages, kBatch, MSG_DONTWAIT, nullptr);
    if (received < 0) {
      if (is_transient(errno)) continue;
      throw CommError(fmt::format("recvmmsg: {}", std::strerror(errno)));
    }
    more = more || static_cast<size_t>(received) == kBatch;
    for (int i = 0; i < received; ++i) {
      if (messages[i].msg_hdr.msg_flags & MSG_TRUNC) continue;
      for (uint32_t shard = 0; shard < aggregators_.size(); ++shard) {
        const sockaddr_in& data = aggregators_[shard].data;
        if (socket_of_[shard] != socket || senders[i].sin_addr.s_addr != data.sin_addr.s_addr ||
            senders[i].sin_port != data.sin_port)
          continue;
        handle({static_cast<const std::byte*>(vectors[i].iov_base), messages[i].msg_len}, shard);
        break;
      }
    }
  }
  return more;
}

void UdpTransport::wait(bool want_send, std::chrono::milliseconds timeout, int wake_fd) {
  std::vector<pollfd> entries{{wake_fd, POLLIN, 0}};
  for (uint32_t socket = 0; socket < sockets_.size(); ++socket) {
    const bool room_matters = want_send && (!blocked_socket_ || *blocked_socket_ == socket);
    entries.push_back({sockets_[socket].get(), static_cast<short>(POLLIN | (room_matters ? POLLOUT : 0)), 0});
  }
  // Errors (EINTR) only shorten the wait; the caller loops on its own deadline.
  ::poll(entries.data(), entries.size(), static_cast<int>(timeout.count()));
}

}  // namespace xagg::worker
