#include "backend.h"
#include "baselines/tcp_ps/tcp_ps_client.h"

namespace xagg::backends {
namespace {

class TcpPsBackend : public BlockingBackend {
 public:
  explicit TcpPsBackend(const baselines::TcpPsClientConfig& config) : client_(config) {}
  void allreduce(float* data, size_t count, ReduceOp op) override { client_.allreduce(data, count, op); }

 private:
  baselines::TcpPsClient client_;
};

}  // namespace

std::unique_ptr<Backend> make_tcp_ps_backend(const BackendConfig& config) {
  baselines::TcpPsClientConfig client;
  client.servers = config.servers;
  client.weights = config.server_weights;
  if (config.port != 0) client.port = config.port;
  client.rank = config.rank;
  client.world_size = config.world_size;
  client.max_elements = config.max_elements;
  client.join_timeout = config.join_timeout;
  client.operation_timeout = config.operation_timeout;
  return one_at_a_time(std::make_unique<TcpPsBackend>(client));
}

}  // namespace xagg::backends
