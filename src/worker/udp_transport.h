// The worker's UDP sockets, one per result port its aggregators gave it
// (usually one for all): bound to 0.0.0.0:result_port (an aggregator only
// accepts DATA from the registered source port, and broadcasts RESULTs to
// that port). They are deliberately not connect()ed: connecting binds a
// socket to the unicast source address, and the kernel then no longer
// delivers the broadcast RESULTs to it. Datagrams from anyone but one of the
// aggregators' data addresses are dropped here instead. An aggregator that
// multicasts its RESULTs names a group, which the socket joins (IGMP) on the
// interface the aggregator is reached by.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "unique_fd.h"
#include "wire.h"

namespace xagg::worker {

class UdpTransport {
 public:
  static constexpr size_t kBatch = 64;  // datagrams per sendmmsg/recvmmsg

  // One of a job's aggregators (a shard), as its join reply describes it.
  struct Aggregator {
    std::string name;     // for messages
    sockaddr_in data{};   // where its DATA goes and its RESULTs come from
    uint16_t result_port = 0;
    std::optional<in_addr> group = std::nullopt;  // where it multicasts RESULTs; none: broadcast or unicast
  };
  struct Outgoing {
    std::span<const std::byte> packet;  // a whole packet, up to kPacketBytes
    uint32_t shard;                     // index into the aggregators
  };

  // Throws CommError. receive_buffer_bytes sizes each socket's SO_RCVBUF.
  UdpTransport(std::vector<Aggregator> aggregators, size_t receive_buffer_bytes);

  // Sends packets in order without blocking; returns how many the kernel
  // took, fewer when a send buffer is full.
  size_t send(std::span<const Outgoing> packets);

  // Receives the datagrams already queued (up to kBatch per socket) without
  // blocking and passes each, with the aggregator it came from, to handle;
  // true if a socket may hold more.
  bool receive(const std::function<void(std::span<const std::byte>, uint32_t shard)>& handle);

  // Waits until a datagram arrives (or, with want_send, the socket a send
  // stopped at can send),
  // wake_fd is readable, or the timeout passes.
  void wait(bool want_send, std::chrono::milliseconds timeout, int wake_fd);

  const std::string& aggregator_name(uint32_t shard) const { return aggregators_[shard].name; }
  uint32_t aggregator_count() const { return static_cast<uint32_t>(aggregators_.size()); }

 private:
  std::vector<Aggregator> aggregators_;
  std::vector<UniqueFd> sockets_;      // one per distinct result port
  std::vector<uint32_t> socket_of_;    // per aggregator
  // The socket whose full send buffer stopped the last send: only its room
  // ends a wait, or another socket's would end every wait at once.
  std::optional<uint32_t> blocked_socket_;
  // One slot more than a packet so that an oversized datagram shows up as
  // MSG_TRUNC instead of looking valid.
  std::vector<std::byte> receive_buffers_;
};

}  // namespace xagg::worker
