// The worker's one UDP socket: bound to 0.0.0.0:result_port (the aggregator
// only accepts DATA from the registered source port, and RESULTs are
// broadcast to that port). It is deliberately not connect()ed: connecting
// binds the socket to the unicast source address, and the kernel then no
// longer delivers the broadcast RESULTs to it. Datagrams from anyone but the
// aggregator's data address are dropped here instead.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "unique_fd.h"
#include "wire.h"

namespace xagg::worker {

class UdpTransport {
 public:
  static constexpr size_t kBatch = 64;  // datagrams per sendmmsg/recvmmsg

  // Throws CommError. receive_buffer_bytes sizes SO_RCVBUF.
  UdpTransport(uint16_t local_port, const sockaddr_in& aggregator, size_t receive_buffer_bytes);

  // Sends whole packets (up to kPacketBytes each) without blocking; returns
  // how many the kernel took, fewer when the send buffer is full.
  size_t send(std::span<const std::span<const std::byte>> packets);

  // Receives the datagrams already queued (up to kBatch) without blocking and
  // passes each to handle; returns how many were received.
  size_t receive(const std::function<void(std::span<const std::byte>)>& handle);

  // Waits until a datagram arrives (or, with want_send, the socket can send),
  // wake_fd is readable, or the timeout passes.
  void wait(bool want_send, std::chrono::milliseconds timeout, int wake_fd);

 private:
  UniqueFd fd_;
  sockaddr_in aggregator_;
  // One slot more than a packet so that an oversized datagram shows up as
  // MSG_TRUNC instead of looking valid.
  std::vector<std::byte> receive_buffers_;
};

}  // namespace xagg::worker
