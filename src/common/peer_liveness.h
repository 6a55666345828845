// When the peer of a control connection counts as dead: the one judgement
// behind libxagg's watch on its aggregators and a leaf aggregator's watch on
// its root (docs/reliability.md, "Liveness").
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "control_channel.h"

namespace xagg {

// What the kernel says of a control connection, as far as liveness needs it.
struct TcpProgress {
  // Since the peer's TCP last sent anything this end accepted: data or a bare acknowledgment (tcpi_last_ack_recv).
  std::chrono::milliseconds since_peer_heard{0};
  // Segments this end retransmitted so far (tcpi_total_retrans): lost, or feared lost.
  uint32_t retransmitted = 0;
  // Segments of the peer that arrived behind a hole so far (tcpi_rcv_ooopack): the peer sends, something was lost.
  uint32_t behind_holes = 0;
  // Bytes from the peer in order and not yet read (FIONREAD): it answered; this end has yet to read it.
  uint32_t unread = 0;
  // Segments of this end the peer holds behind a hole now (tcpi_sacked): it is receiving, something was lost.
  uint32_t sacked = 0;
};

// Reads TCP_INFO and FIONREAD; throws CommError if the socket cannot tell.
TcpProgress read_tcp_progress(int tcp_socket);

// A peer that answers every message it reads (ping, pong) is dead when its
// silence outlasts what TCP accounts for. TCP retransmits on a control
// connection as on any other: a lost answer waits an RTO (200 ms and up,
// doubled per lost retransmission), and a sender whose window an earlier
// loss shrank to one segment holds every later answer back meanwhile.
// Measured at 3% loss per frame on every link, answers came up to 1.8 s
// late, the peer's kernel acknowledging this end's pings throughout, and
// TCP itself fell silent for over 500 ms now and then.
//
// The peer's retransmissions cannot be seen from this end, so a silence of
// dead_after or more is excused while the peer's TCP still acknowledges: it
// was heard (data or a bare acknowledgment; the pings keep those coming
// while its kernel is reachable) within dead_after, and the silence is under
// twice dead_after. On a lossy path both allowances are kLossyPathFactor
// times longer. A path is lossy while TCP saw a loss, within
// kLossMemoryPerDeadAfter x dead_after, that the peer was heard through
// afterwards: a retransmission of this end followed by a message, or the
// peer's data arriving behind a hole. A retransmission into a silence
// proves nothing: a cut link causes those too. Bytes that came and wait
// unread (a reader that was not scheduled) are no silence.
//
// Detection at the default dead_after of 500 ms, plus the caller's poll: a
// killed peer at once (the connection closes); a cut link or a vanished
// host, which silence TCP too, after 0.5 s (1 s on a lossy path); a hung
// peer process, whose kernel still acknowledges and which cannot be told
// from its TCP retransmitting, after 1 s (2 s: kMaxSilencePerDeadAfter x
// dead_after, the hard limit).
class PeerLiveness {
 public:
  static constexpr int kLossyPathFactor = 2;
  static constexpr int kMaxSilencePerDeadAfter = 2 * kLossyPathFactor;
  // 10 s at the default: a path losing 1% of its frames shows a loss on a
  // control connection (about 20 segments a second each way) every few seconds.
  static constexpr int kLossMemoryPerDeadAfter = 20;

  PeerLiveness(std::chrono::milliseconds dead_after, Clock::time_point now, const TcpProgress& tcp);

  // A message came from the peer.
  void heard(Clock::time_point now);
  // Why the peer is dead, or nullopt while it may be alive. Call it often
  // (every heartbeat at least): it also notes the losses TCP saw.
  std::optional<std::string> judge(Clock::time_point now, const TcpProgress& tcp);
  std::chrono::milliseconds silence(Clock::time_point now) const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(now - last_heard_);
  }
  bool overdue(Clock::time_point now) const { return now - last_heard_ >= dead_after_; }
  // The latest time the peer can still be alive without another message.
  Clock::time_point give_up_at() const { return last_heard_ + kMaxSilencePerDeadAfter * dead_after_; }

 private:
  bool lossy(Clock::time_point now) const {
    return lossy_at_ && now - *lossy_at_ < kLossMemoryPerDeadAfter * dead_after_;
  }

  std::chrono::milliseconds dead_after_;
  Clock::time_point last_heard_;
  uint32_t retransmitted_;
  uint32_t behind_holes_;
  bool retransmitted_in_silence_ = false;      // since the last message
  std::optional<Clock::time_point> lossy_at_;  // the latest loss the peer was heard through
};

// Holds a control connection's peer to account: a `ping` every fifth of
// dead_after (the peer answers each with `pong`, protocol.md section 8), judged by PeerLiveness.
class Heartbeat {
 public:
  Heartbeat(ControlChannel& channel, std::chrono::milliseconds dead_after);

  // A message came on the channel; logs the silence it ends where that was excused.
  void heard();
  // Sends a ping when one is due. Returns why the peer is dead, or nullopt.
  // Throws CommError as ControlChannel::send does.
  std::optional<std::string> check();
  // When check() must run next.
  Clock::time_point next_ping() const { return next_ping_; }

 private:
  ControlChannel& channel_;
  std::chrono::milliseconds ping_every_;
  PeerLiveness liveness_;
  Clock::time_point next_ping_;
};

}  // namespace xagg
