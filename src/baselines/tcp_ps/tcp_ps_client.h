// Worker side of the TCP parameter-server baseline; mirrors xagg::Communicator
// so benchmarks can swap the two.
//
//   xagg::baselines::TcpPsClientConfig config;
//   config.server = "127.0.0.1"; config.rank = r; config.world_size = 4;
//   config.max_elements = grad.size();
//   xagg::baselines::TcpPsClient client(config);  // returns once every rank has joined
//   client.allreduce(grad.data(), grad.size(), xagg::ReduceOp::Average);
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "baselines/tcp_ps/protocol.h"
#include "unique_fd.h"
#include "xagg/communicator.h"

namespace xagg::baselines {

struct TcpPsClientConfig {
  std::string server;              // IPv4 address of the TcpPsServer
  uint16_t port = 9990;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint64_t max_elements = 0;       // largest tensor all-reduced in this job
  std::chrono::milliseconds join_timeout{30000};       // until every rank has joined
  std::chrono::milliseconds operation_timeout{60000};  // one all-reduce, start to end
  int socket_buffer_bytes = tcp_ps::kDefaultSocketBufferBytes;  // 0: kernel autotuning
};

class TcpPsClient {
 public:
  // Connects and joins; throws ConfigError (bad config, refused hello),
  // CommError or TimeoutError.
  explicit TcpPsClient(TcpPsClientConfig config);
  TcpPsClient(const TcpPsClient&) = delete;
  TcpPsClient& operator=(const TcpPsClient&) = delete;

  // In-place all-reduce; every rank calls with the same count and order. The
  // push and the result stream overlap on one non-blocking socket. Throws
  // CommError on a server error or lost connection and TimeoutError past the
  // deadline; after either the client is unusable.
  void allreduce(float* data, size_t count, ReduceOp op = ReduceOp::Sum);

  uint32_t rank() const { return config_.rank; }
  uint32_t world_size() const { return config_.world_size; }

 private:
  void join();

  TcpPsClientConfig config_;
  UniqueFd fd_;
  uint64_t iteration_ = 0;
  bool broken_ = false;
};

}  // namespace xagg::baselines
