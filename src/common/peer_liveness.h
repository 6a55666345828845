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
};

// Reads TCP_INFO and FIONREAD; throws CommError if the socket cannot tell.
TcpProgress read_tcp_progress(int tcp_socket);

// A peer that answers every message it reads (ping, pong) is dead when
// nothing has come from it for dead_after, unless TCP accounts for the
// silence. On a lossy path it does: a lost answer is retransmitted after an
// RTO (200 ms and up, doubled for each lost retransmission), and a sender
// whose window shrank to one segment after an earlier loss holds every
// later answer back meanwhile. Measured at 3% loss per frame on every link,
// answers then came up to 1.8 s late, the peer's kernel acknowledging our
// pings all along, and TCP itself fell silent for over 500 ms now and then.
//
// So a silence of dead_after or more is excused while the peer's TCP keeps
// acknowledging (the pings, every fifth of dead_after, keep those coming
// while its kernel is reachable): while it was heard within dead_after, for
// up to twice dead_after of silence. On a lossy path, twice as long: TCP
// heard within twice dead_after, up to kMaxSilencePerDeadAfter (4) x
// dead_after, the hard limit. A path is lossy while TCP saw a loss, within
// kLossMemoryPerDeadAfter x dead_after, that the peer was heard through
// afterwards (a retransmission of ours before a later message, or data of
// the peer behind a hole); a retransmission into a silence proves nothing:
// a cut link causes those too. Even a path without loss gets the first tier:
// the peer's own retransmissions cannot be seen from this end, and the
// first loss of a connection is not yet history.
//
// That bounds what cannot be told from TCP's retransmissions: a hung peer
// process, whose kernel still acknowledges. Bytes that came and wait unread
// (a reader that was not scheduled) are not silence. At the default
// dead_after of 500 ms (plus the caller's poll), a killed peer is found at
// once (the connection closes), a cut link or a vanished host after 0.5 s
// on a path without loss and 1 s on a lossy one (TCP falls silent), a hung
// peer process after 1 s and 2 s respectively.
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
