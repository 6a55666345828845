// The "gloo" baseline: Gloo's ring all-reduce over TCP between the ranks,
// as PyTorch's Gloo process group runs it. Ranks meet through a file store in
// a directory they all reach and then talk over a full TCP mesh bound to each
// rank's own address (its testbed link), so the traffic crosses the bridge.
#include <fmt/format.h>
#include <gloo/allreduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <exception>

#include "backend.h"

namespace xagg::backends {
namespace {

void sum_floats(void* out, const void* a, const void* b, size_t count) {
  auto* result = static_cast<float*>(out);
  const auto* left = static_cast<const float*>(a);
  const auto* right = static_cast<const float*>(b);
  for (size_t i = 0; i < count; ++i) result[i] = left[i] + right[i];
}

class GlooBackend : public BlockingBackend {
 public:
  explicit GlooBackend(const BackendConfig& config) : world_size_(config.world_size) {
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
    gloo::AllreduceOptions options(context_);
    options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    options.setOutput(data, count);
    options.setReduceFunction(sum_floats);
    options.setTag(next_tag_++);
    try {
      gloo::allreduce(options);
    } catch (const std::exception& error) {
      throw CommError(fmt::format("gloo all-reduce of {} floats failed: {}", count, error.what()));
    }
    if (op == ReduceOp::Average)
      for (size_t i = 0; i < count; ++i) data[i] /= static_cast<float>(world_size_);
  }

 private:
  uint32_t world_size_;
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
