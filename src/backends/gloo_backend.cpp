// The "gloo" baseline: Gloo's ring all-reduce over TCP between the ranks,
// as PyTorch's Gloo process group runs it. Ranks meet through a file store in
// a directory they all reach and then talk over a full TCP mesh bound to each
// rank's own address (its testbed link), so the traffic crosses the bridge.
// With wire_bits 16 it all-reduces float16 as DDP's fp16_compress_hook does:
// each all-reduce's data converted to float16 (divided by the world size first
// for an average), summed in float16 by Gloo and converted back.
#include <fmt/format.h>
#include <gloo/allreduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <exception>
#include <vector>

#include "backend.h"
#include "float16.h"

namespace xagg::backends {
namespace {

void sum_floats(void* out, const void* a, const void* b, size_t count) {
  auto* result = static_cast<float*>(out);
  const auto* left = static_cast<const float*>(a);
  const auto* right = static_cast<const float*>(b);
  for (size_t i = 0; i < count; ++i) result[i] = left[i] + right[i];
}

void sum_halves(void* out, const void* a, const void* b, size_t count) {
  float16::add(static_cast<gloo::float16*>(out), static_cast<const gloo::float16*>(a),
               static_cast<const gloo::float16*>(b), count);
}

class GlooBackend : public BlockingBackend {
 public:
  explicit GlooBackend(const BackendConfig& config) : world_size_(config.world_size), float16_(config.wire_bits == 16) {
    gloo::transport::tcp::attr address(config.local_address.c_str());
    auto device = gloo::transport::tcp::CreateDevice(address);
    gloo::rendezvous::FileStore store(config.rendezvous);
    context_ = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(config.rank),
                                                           static_cast<int>(config.world_size));
    context_->setTimeout(config.join_timeout);
    try {
      context_->connectFullMesh(store, device);
    } catch (const std::exception& error) {
      throw CommError(fmt::format("gloo rendezvous in {} failed: {}", config.rendezvous, error.what()));
    }
    context_->setTimeout(config.operation_timeout);
  }

  void allreduce(float* data, size_t count, ReduceOp op) override {
    if (op != ReduceOp::Sum && op != ReduceOp::Average) throw ConfigError("gloo: only sum and average all-reduces");
    const bool average = op == ReduceOp::Average;
    if (float16_) {
      halves_.resize(count);
      float16::from_float(data, halves_.data(), count, average ? static_cast<float>(world_size_) : 1.0f);
      ring_allreduce(halves_.data(), count, sum_halves);
      float16::to_float(halves_.data(), data, count);
      return;
    }
    ring_allreduce(data, count, sum_floats);
    if (average)
      for (size_t i = 0; i < count; ++i) data[i] /= static_cast<float>(world_size_);
  }

 private:
  template <typename T>
  void ring_allreduce(T* data, size_t count, gloo::AllreduceOptions::Func sum) {
    gloo::AllreduceOptions options(context_);
    options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    options.setOutput(data, count);
    options.setReduceFunction(sum);
    options.setTag(next_tag_++);
    try {
      gloo::allreduce(options);
    } catch (const std::exception& error) {
      throw CommError(fmt::format("gloo all-reduce of {} {} failed: {}", count, float16_ ? "float16 values" : "floats",
                                  error.what()));
    }
  }

  uint32_t world_size_;
  bool float16_;                       // BackendConfig::wire_bits 16
  std::vector<gloo::float16> halves_;  // float16: the all-reduce's data while Gloo sums it
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t next_tag_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_gloo_backend(const BackendConfig& config) {
  if (config.rendezvous.empty()) throw ConfigError("backend 'gloo' needs a rendezvous directory");
  if (config.local_address.empty()) throw ConfigError("backend 'gloo' needs this rank's local address");
  if (config.world_size == 0 || config.rank >= config.world_size)
    throw ConfigError(fmt::format("backend 'gloo': rank {} outside world size {}", config.rank, config.world_size));
  return one_at_a_time(std::make_unique<GlooBackend>(config));
}

}  // namespace xagg::backends
