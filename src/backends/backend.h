// One all-reduce interface over every system the benchmarks and training
// compare: XAgg itself and the baselines. `xagg worker --backend NAME` and
// `xagg train --backend NAME` go through it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "xagg/communicator.h"

namespace xagg::backends {

struct BackendConfig {
  std::string name;             // "xagg", "tcp-ps", "gloo", "switch"
  // The job's aggregators (or parameter servers), IPv4, in the same order on
  // every rank; a job's data is spread over them (unused by gloo; the switch
  // baseline takes exactly one).
  std::vector<std::string> servers;
  std::vector<uint32_t> server_weights = {};  // relative share of each; empty: equal
  uint16_t port = 0;            // their control / service port (0: the system's default)
  uint32_t job_id = 1;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint64_t max_elements = 0;
  std::string rendezvous;       // gloo: a directory every rank can reach (file store)
  std::string local_address;    // gloo: this rank's IPv4 address to listen on
  std::chrono::milliseconds join_timeout{30000};
  std::chrono::milliseconds operation_timeout{60000};
  std::string cluster_secret = {};  // xagg: CommunicatorConfig::cluster_secret
  uint32_t mtu = 0;             // xagg: CommunicatorConfig::mtu (0: the path MTU)
  std::chrono::milliseconds aggregator_dead_after{500};  // xagg: CommunicatorConfig::aggregator_dead_after
  // xagg, a two-level job: `servers` are the leaf aggregators (CommunicatorConfig::root_aggregator).
  std::string root_server = {};
  uint32_t ranks_per_leaf = 0;
  // Bits per element on the wire: 32, or 16 where supports_wire_bits says so
  // (xagg: CommunicatorConfig::wire_bits; gloo: float16, as DDP's fp16_compress_hook).
  uint32_t wire_bits = 32;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // In-place all-reduce of float32, started at once; every rank calls with
  // the same counts in the same order. Works complete in call order; data
  // must stay valid until then. XAgg runs several at once; the baselines run
  // them one at a time (OneAtATime), as their protocols do.
  virtual std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op) = 0;
  void allreduce(float* data, size_t count, ReduceOp op) { allreduce_async(data, count, op)->wait(); }
  // A training step starts (Communicator::begin_step); only XAgg places by step.
  virtual void begin_step() {}
  // Elements that share one quantization exponent (XAgg: its job's chunk); 0: none.
  virtual uint32_t chunk_elements() const { return 0; }
};

// A system whose all-reduce blocks the calling thread.
class BlockingBackend {
 public:
  virtual ~BlockingBackend() = default;
  virtual void allreduce(float* data, size_t count, ReduceOp op) = 0;
};

// Runs a blocking system's all-reduces in call order on a thread of its own.
std::unique_ptr<Backend> one_at_a_time(std::unique_ptr<BlockingBackend> system);

// Throws ConfigError for an unknown name or a bad configuration.
std::unique_ptr<Backend> make_backend(const BackendConfig& config);
std::vector<std::string> backend_names();
// Whether the backend sends `wire_bits` bits per element: 32 every one, 16 xagg and gloo.
bool supports_wire_bits(const std::string& backend, uint32_t wire_bits);

// XAgg's own configuration for the same settings (int32 all-reduce goes to a
// Communicator directly: the Backend interface is float32 only).
CommunicatorConfig communicator_config(const BackendConfig& config);

// Implemented by each system's adapter (xagg_backend.cpp, tcp_ps_backend.cpp, ...).
std::unique_ptr<Backend> make_xagg_backend(const BackendConfig& config);
std::unique_ptr<Backend> make_tcp_ps_backend(const BackendConfig& config);
std::unique_ptr<Backend> make_gloo_backend(const BackendConfig& config);
std::unique_ptr<Backend> make_switch_backend(const BackendConfig& config);

}  // namespace xagg::backends
