// Baseline for XAgg: a TCP parameter server that all-reduces float32 gradients.
//
// One job of world_size workers at a time. Every worker streams its gradient;
// as soon as all copies of a chunk have arrived the server sums them in rank
// order (deterministic) and streams the sum back to every worker, so results
// flow while later chunks are still arriving. One receive thread per worker
// fills a small ring of chunk slots; the thread that called run() reduces and
// sends, in chunk order.
//
//   xagg::baselines::TcpPsServer server({.port = 9990, .world_size = 4});
//   std::jthread serving([&] { server.run(); });
//   ...
//   server.stop();
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "baselines/tcp_ps/protocol.h"
#include "unique_fd.h"

namespace xagg::baselines {

struct TcpPsServerConfig {
  std::string bind_address = "127.0.0.1";
  uint16_t port = 9990;          // 0 picks a free port; see TcpPsServer::port()
  uint32_t world_size = 0;       // 0: taken from the first worker's hello
  size_t chunk_bytes = tcp_ps::kDefaultChunkBytes;
  size_t ring_chunks = 8;        // chunks a worker may run ahead of the reduction
  int socket_buffer_bytes = tcp_ps::kDefaultSocketBufferBytes;  // 0: kernel autotuning
  std::chrono::milliseconds hello_timeout{5000};  // for a connection to send its hello
  std::chrono::milliseconds send_timeout{30000};  // a worker taking no results this long fails the job
};

class TcpPsServer {
 public:
  // Binds and listens; throws ConfigError or CommError.
  explicit TcpPsServer(TcpPsServerConfig config);
  ~TcpPsServer();
  TcpPsServer(const TcpPsServer&) = delete;
  TcpPsServer& operator=(const TcpPsServer&) = delete;

  uint16_t port() const { return port_; }

  // Serves jobs one after another until stop().
  void run();
  // Thread-safe; aborts the running job (its workers get an error) and makes
  // run() return, within send_timeout even if a worker stopped reading.
  void stop();

  class Job;

 private:
  // Accepts connections until world_size ranks have said hello; null on stop().
  std::unique_ptr<Job> gather_job();

  TcpPsServerConfig config_;
  UniqueFd listener_;
  UniqueFd wakeup_;  // eventfd that interrupts gather_job() on stop()
  uint16_t port_ = 0;
  std::mutex mutex_;
  bool stopping_ = false;
  Job* running_job_ = nullptr;
};

}  // namespace xagg::baselines
