#include "backend.h"

namespace xagg::backends {
namespace {

class XaggBackend : public Backend {
 public:
  explicit XaggBackend(const CommunicatorConfig& config) : communicator_(config) {}
  std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op) override {
    return communicator_.allreduce_async(data, count, op);
  }
  void begin_step() override { communicator_.begin_step(); }
  uint32_t chunk_elements() const override { return communicator_.chunk_elements(); }

 private:
  Communicator communicator_;
};

}  // namespace

CommunicatorConfig communicator_config(const BackendConfig& config) {
  CommunicatorConfig communicator;
  communicator.aggregators = config.servers;
  communicator.aggregator_weights = config.server_weights;
  if (config.port != 0) communicator.control_port = config.port;
  communicator.job_id = config.job_id;
  communicator.rank = config.rank;
  communicator.world_size = config.world_size;
  communicator.max_elements = config.max_elements;
  communicator.join_timeout = config.join_timeout;
  communicator.operation_timeout = config.operation_timeout;
  communicator.cluster_secret = config.cluster_secret;
  communicator.mtu = config.mtu;
  communicator.aggregator_dead_after = config.aggregator_dead_after;
  communicator.root_aggregator = config.root_server;
  communicator.ranks_per_leaf = config.ranks_per_leaf;
  communicator.wire_bits = config.wire_bits;
  return communicator;
}

std::unique_ptr<Backend> make_xagg_backend(const BackendConfig& config) {
  return std::make_unique<XaggBackend>(communicator_config(config));
}

}  // namespace xagg::backends
