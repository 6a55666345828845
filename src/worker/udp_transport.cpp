#include "udp_transport.h"

#include <netinet/ip.h>
#include <netinet/udp.h>
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

}  // namespace

UdpTransport::UdpTransport(uint16_t local_port, const sockaddr_in& aggregator, size_t receive_buffer_bytes)
    : fd_(::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)),
      aggregator_(aggregator),
      receive_buffers_(kBatch * kReceiveSlotBytes) {
  if (!fd_) throw CommError(fmt::format("UDP socket: {}", std::strerror(errno)));
  set_buffer(fd_.get(), SO_RCVBUFFORCE, SO_RCVBUF, receive_buffer_bytes, "SO_RCVBUF", "rmem_max",
             receive_buffer_warned);
  set_buffer(fd_.get(), SO_SNDBUFFORCE, SO_SNDBUF, kSendBufferBytes, "SO_SNDBUF", "wmem_max", send_buffer_warned);
  // Never fragment: the aggregator drops IP fragments, so on a link whose MTU
  // is too small a send must fail with EMSGSIZE rather than time out.
  int no_fragments = IP_PMTUDISC_DO;
  ::setsockopt(fd_.get(), IPPROTO_IP, IP_MTU_DISCOVER, &no_fragments, sizeof(no_fragments));
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = htonl(INADDR_ANY);
  local.sin_port = htons(local_port);
  // No SO_REUSEADDR: a second rank of the job on this host would share the
  // port, and a result resent to one rank could reach the other.
  if (::bind(fd_.get(), reinterpret_cast<const sockaddr*>(&local), sizeof(local)) != 0)
    throw CommError(fmt::format("bind UDP 0.0.0.0:{}: {}{}", local_port, std::strerror(errno),
                                errno == EADDRINUSE ? " (another rank of the job on this host? ranks of a job need "
                                                      "distinct IPv4 addresses, docs/protocol.md section 2)"
                                                    : ""));
}

size_t UdpTransport::send(std::span<const std::span<const std::byte>> packets) {
  size_t total = 0;
  while (total < packets.size()) {
    size_t count = std::min(kBatch, packets.size() - total);
    iovec vectors[kBatch];
    mmsghdr messages[kBatch] = {};
    for (size_t i = 0; i < count; ++i) {
      vectors[i] = {const_cast<std::byte*>(packets[total + i].data()), packets[total + i].size()};
      messages[i].msg_hdr.msg_iov = &vectors[i];
      messages[i].msg_hdr.msg_iovlen = 1;
      messages[i].msg_hdr.msg_name = &aggregator_;
      messages[i].msg_hdr.msg_namelen = sizeof(aggregator_);
    }
    int sent = ::sendmmsg(fd_.get(), messages, static_cast<unsigned>(count), MSG_DONTWAIT);
    if (sent < 0) {
      if (is_transient(errno)) return total;
      if (errno == EMSGSIZE)
        throw CommError(fmt::format("sendmmsg: datagrams of up to {} bytes exceed the path MTU; XAgg needs links "
                                    "with an MTU of at least {} (docs/protocol.md, section 3)",
                                    wire::kPacketBytes, wire::kPacketBytes + sizeof(iphdr) + sizeof(udphdr)));
      throw CommError(fmt::format("sendmmsg: {}", std::strerror(errno)));
    }
    total += static_cast<size_t>(sent);
    if (static_cast<size_t>(sent) < count) return total;
  }
  return total;
}

size_t UdpTransport::receive(const std::function<void(std::span<const std::byte>)>& handle) {
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
  int received = ::recvmmsg(fd_.get(), messages, kBatch, MSG_DONTWAIT, nullptr);
  if (received < 0) {
    if (is_transient(errno)) return 0;
    throw CommError(fmt::format("recvmmsg: {}", std::strerror(errno)));
  }
  for (int i = 0; i < received; ++i) {
    if (messages[i].msg_hdr.msg_flags & MSG_TRUNC) continue;
    if (senders[i].sin_addr.s_addr != aggregator_.sin_addr.s_addr || senders[i].sin_port != aggregator_.sin_port)
      continue;
    handle({static_cast<const std::byte*>(vectors[i].iov_base), messages[i].msg_len});
  }
  return static_cast<size_t>(received);
}

void UdpTransport::wait(bool want_send, std::chrono::milliseconds timeout, int wake_fd) {
  pollfd entries[] = {{fd_.get(), static_cast<short>(POLLIN | (want_send ? POLLOUT : 0)), 0}, {wake_fd, POLLIN, 0}};
  // Errors (EINTR) only shorten the wait; the caller loops on its own deadline.
  ::poll(entries, 2, static_cast<int>(timeout.count()));
}

}  // namespace xagg::worker
