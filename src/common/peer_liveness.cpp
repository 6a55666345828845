#include "peer_liveness.h"

// linux/tcp.h, not netinet/tcp.h: glibc's tcp_info lacks tcpi_rcv_ooopack.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "inet.h"
#include "xagg/errors.h"

namespace xagg {

TcpProgress read_tcp_progress(int tcp_socket) {
  tcp_info info{};
  socklen_t length = sizeof(info);
  int unread = 0;
  if (::getsockopt(tcp_socket, IPPROTO_TCP, TCP_INFO, &info, &length) != 0 ||
      ::ioctl(tcp_socket, FIONREAD, &unread) != 0)
    throw CommError(fmt::format("TCP state of the control connection: {}", std::strerror(errno)));
  return TcpProgress{.since_peer_heard = std::chrono::milliseconds(info.tcpi_last_ack_recv),
                     .retransmitted = info.tcpi_total_retrans,
                     .behind_holes = info.tcpi_rcv_ooopack,
                     .unread = static_cast<uint32_t>(unread),
                     .sacked = info.tcpi_sacked};
}

PeerLiveness::PeerLiveness(std::chrono::milliseconds dead_after, Clock::time_point now, const TcpProgress& tcp)
    : dead_after_(dead_after), last_heard_(now), retransmitted_(tcp.retransmitted), behind_holes_(tcp.behind_holes) {}

void PeerLiveness::heard(Clock::time_point now) {
  last_heard_ = now;
  if (retransmitted_in_silence_) lossy_at_ = now;
  retransmitted_in_silence_ = false;
}

std::optional<std::string> PeerLiveness::judge(Clock::time_point now, const TcpProgress& tcp) {
  if (tcp.retransmitted != retransmitted_) retransmitted_in_silence_ = true;
  // Unlike a retransmission (a cut link causes those too), data selectively
  // acknowledged behind a hole, either way, shows the peer alive after the loss.
  if (tcp.behind_holes != behind_holes_ || tcp.sacked > 0) lossy_at_ = now;
  retransmitted_ = tcp.retransmitted;
  behind_holes_ = tcp.behind_holes;
  if (!overdue(now) || tcp.unread > 0) return std::nullopt;
  const int allowance = lossy(now) ? kLossyPathFactor : 1;
  if (now - last_heard_ < 2 * allowance * dead_after_ && tcp.since_peer_heard < allowance * dead_after_)
    return std::nullopt;
  return fmt::format("no answer on its control connection for {} ms; its TCP last heard {} ms ago, {}",
                     silence(now).count(), tcp.since_peer_heard.count(),
                     lossy(now) ? "on a lossy path" : "on a path without loss lately");
}

Heartbeat::Heartbeat(ControlChannel& channel, std::chrono::milliseconds dead_after)
    : channel_(channel),
      ping_every_(dead_after / 5),
      liveness_(dead_after, Clock::now(), channel.tcp_progress()),
      next_ping_(Clock::now()) {}

void Heartbeat::heard() {
  const Clock::time_point now = Clock::now();
  // Only an excused silence lasts this long: how long, for who tunes dead_after.
  if (liveness_.overdue(now))
    spdlog::info("xagg: aggregator {} answered after {} ms of silence, excused by TCP (peer_liveness.h)",
                 to_string(channel_.peer()), liveness_.silence(now).count());
  liveness_.heard(now);
}

std::optional<std::string> Heartbeat::check() {
  const Clock::time_point now = Clock::now();
  if (auto death = liveness_.judge(now, channel_.tcp_progress())) return death;
  if (now >= next_ping_) {
    channel_.send(control::Ping{}, liveness_.give_up_at());
    next_ping_ = now + ping_every_;
  }
  return std::nullopt;
}

}  // namespace xagg
