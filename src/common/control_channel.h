// Client side of the TCP control connection (a worker's, or a leaf aggregator's
// to its parent): JSON lines with deadlines on
// every blocking step, so that no call can wait forever.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>

#include "control_messages.h"
#include "unique_fd.h"

namespace xagg {

using Clock = std::chrono::steady_clock;
struct TcpProgress;  // peer_liveness.h

// One thread may receive while others send (the socket is full duplex; a
// line is sent whole under a lock); two threads must not both receive.
class ControlChannel {
 public:
  // Connects with connect_before (inet.h): retries unreachable attempts,
  // throws CommError for other errors, TimeoutError at the deadline.
  ControlChannel(const sockaddr_in& aggregator, Clock::time_point deadline);

  // Throws CommError if the connection fails, TimeoutError at the deadline.
  void send(const control::Message& message, Clock::time_point deadline);

  // The next message, or nullopt once the deadline passes. Throws CommError
  // when the aggregator closes the connection or sends a malformed line.
  std::optional<control::Message> receive(Clock::time_point deadline);

  // This end's address on the connection.
  in_addr local_address() const;
  const sockaddr_in& peer() const { return peer_; }

  // What TCP says of the connection; throws CommError if it cannot tell.
  TcpProgress tcp_progress() const;

 private:
  std::optional<control::Message> take_buffered_line();

  std::mutex send_mutex_;
  UniqueFd fd_;
  sockaddr_in peer_{};
  std::string received_;
};

}  // namespace xagg
