// Settings of one training run, shared by the coordinator and its workers
// (which get them as one JSON argument, so every rank trains the same way).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace xagg::train {

struct TrainConfig {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";  // gzip'd IDX files
  std::string cache_dir = "/var/tmp/xtrain-fashion-mnist";     // their decompressed copies
  std::string model = "cnn";  // "cnn" or "mlp" (trainer.cpp)
  int64_t hidden = 3000;       // mlp: width of its two hidden layers
  uint32_t epochs = 1;
  uint32_t batch_size = 64;  // global: split evenly over the workers
  double learning_rate = 0.02;
  double momentum = 0.9;
  uint64_t seed = 1;
  uint32_t train_samples = 0;  // the first N training images (0: all 60000)
  uint32_t test_samples = 0;   // the first N test images (0: all 10000)
  uint64_t bucket_elements = 65536;
  uint32_t threads = 1;  // torch intra-op threads per worker
  uint32_t progress_every = 10;  // steps between progress events
  uint32_t eval_every = 0;       // steps between test evaluations within an epoch (0: only at its end)
  // Per rank: >1 emulates a slower worker by sleeping (factor - 1) x its compute time each step.
  std::vector<double> compute_skew;

  // How the workers reach each other; filled in by the coordinator.
  std::string backend = "none";  // "none" (single process) or a name of src/backends
  std::vector<std::string> servers;  // the aggregators' (or parameter servers') addresses
  std::string root_server;           // a two-level XAgg job's root; its servers are the leaves
  uint32_t ranks_per_leaf = 0;
  uint16_t port = 0;             // 0: the backend's default
  uint32_t job_id = 1;
  uint32_t wire_bits = 32;       // xagg, ddp-xagg: the XAgg job's wire width (32 or 16)
  uint32_t world_size = 1;
  std::string rendezvous;        // gloo's file-store directory
};

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TrainConfig, data_dir, cache_dir, model, hidden, epochs, batch_size, learning_rate,
                                                momentum, seed, train_samples, test_samples, bucket_elements, threads,
                                                progress_every, eval_every, compute_skew, backend, servers, root_server,
                                                ranks_per_leaf, port, job_id, wire_bits,
                                                world_size, rendezvous)

}  // namespace xagg::train
