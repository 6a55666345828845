#include "backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace xagg::backends {

std::vector<std::string> backend_names() { return {"xagg", "tcp-ps", "gloo", "switch"}; }

std::unique_ptr<Backend> make_backend(const BackendConfig& config) {
  if (config.name == "xagg") return make_xagg_backend(config);
  if (config.name == "tcp-ps") return make_tcp_ps_backend(config);
  if (config.name == "gloo") return make_gloo_backend(config);
  if (config.name == "switch") return make_switch_backend(config);
  throw ConfigError(fmt::format("unknown backend '{}' (known: {})", config.name, fmt::join(backend_names(), ", ")));
}

}  // namespace xagg::backends
