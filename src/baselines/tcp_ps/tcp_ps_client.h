// Worker side of the TCP parameter-server baseline; mirrors xagg::Communicator
// so benchmarks can swap the two. Like BytePS, it shards every tensor over K
// independent servers: each all-reduce sends one contiguous piece to each.
//
//   xagg::baselines::TcpPsClientConfig config;
//   config.servers = {"10.0.0.1", "10.0.0.2"}; config.rank = r; config.world_size = 4;
//   config.max_elements = grad.size();
//   xagg::baselines::TcpPsClient client(config);  // returns once every rank has joined every server
//   client.allreduce(grad.data(), grad.size(), xagg::ReduceOp::Average);
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "baselines/tcp_ps/protocol.h"
#include "unique_fd.h"
#include "xagg/communicator.h"

namespace xagg::baselines {

struct TcpPsClientConfig {
  std::vector<std::string> servers;    // IPv4 addresses of the TcpPsServers, in the same order on every rank
  // Each server's relative share of every tensor; empty: equal shares. (The
  // initializer lets designated initializers leave it out without a warning.)
  std::vector<uint32_t> weights = {};
  uint16_t port = 9990;                // every server's port
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint64_t max_elements = 0;           // largest tensor all-reduced in this job
  std::chrono::milliseconds join_timeout{30000};       // until every rank has joined every server
  std::chrono::milliseconds operation_timeout{60000};  // one all-reduce, start to end
  int socket_buffer_bytes = tcp_ps::kDefaultSocketBufferBytes;  // 0: kernel autotuning
};

namespace tcp_ps {

inline constexpr size_t kMaxServers = 64;

// Sizes of the contiguous pieces, in server order, that a tensor of `count`
// elements is split into: proportional to `weights` (at least one, all
// positive), rounded by largest remainder with ties to the earlier server.
// Depends on nothing else, so every rank computes the same split.
std::vector<size_t> split_by_weight(uint64_t count, std::span<const uint32_t> weights);

}  // namespace tcp_ps

class TcpPsClient {
 public:
  // Connects to and joins every server; throws ConfigError (bad config, a
  // refused hello), CommError or TimeoutError, naming the server.
  explicit TcpPsClient(TcpPsClientConfig config);
  TcpPsClient(const TcpPsClient&) = delete;
  TcpPsClient& operator=(const TcpPsClient&) = delete;

  // In-place all-reduce; every rank calls with the same count and order. The
  // pieces' pushes and result streams overlap on non-blocking sockets, one
  // per server; a server whose piece is empty sits the call out. Throws
  // CommError on a server's error or a lost connection and TimeoutError past
  // the deadline, naming the server; after either the client is unusable. A
  // timeout closes every connection so that the servers fail the job for the
  // other ranks; after a CommError, which every rank gets from the failed
  // server itself, the other servers' job ends when the client is destroyed.
  void allreduce(float* data, size_t count, ReduceOp op = ReduceOp::Sum);

  uint32_t rank() const { return config_.rank; }
  uint32_t world_size() const { return config_.world_size; }

 private:
  struct ServerConnection {
    std::string name;  // "a.b.c.d:port", for messages
    sockaddr_in address;
    UniqueFd fd;
    uint64_t next_iteration = 0;  // the server counts only the all-reduces it takes part in
  };

  void join();

  TcpPsClientConfig config_;
  std::vector<ServerConnection> servers_;
  uint64_t allreduce_calls_ = 0;
  bool broken_ = false;
};

}  // namespace xagg::baselines
