#include <fmt/format.h>

#include "backend.h"
#include "baselines/switch/switch_client.h"

namespace xagg::backends {
namespace {

class SwitchBackend : public BlockingBackend {
 public:
  explicit SwitchBackend(const baselines::switchml::SwitchClientConfig& config) : client_(config) {}
  void allreduce(float* data, size_t count, ReduceOp op) override { client_.allreduce(data, count, op); }

 private:
  baselines::switchml::SwitchClient client_;
};

}  // namespace

std::unique_ptr<Backend> make_switch_backend(const BackendConfig& config) {
  // It models one switch: a job has exactly one.
  if (config.servers.size() != 1)
    throw ConfigError(fmt::format("the switch baseline takes one aggregator, not {}", config.servers.size()));
  std::optional<baselines::switchml::PoolShape> pool = baselines::switchml::switch_pool_shape(config.name);
  if (!pool) throw ConfigError(fmt::format("'{}' is not a switch backend", config.name));
  baselines::switchml::SwitchClientConfig client;
  client.server = config.servers.front();
  client.pool = *pool;
  client.control_port = config.port;
  client.job_id = config.job_id;
  client.rank = config.rank;
  client.world_size = config.world_size;
  client.join_timeout = config.join_timeout;
  client.operation_timeout = config.operation_timeout;
  return one_at_a_time(std::make_unique<SwitchBackend>(client));
}

}  // namespace xagg::backends
