// Placeholder until the switch baseline lands.
#include "backend.h"

namespace xagg::backends {
std::unique_ptr<Backend> make_switch_backend(const BackendConfig&) { throw ConfigError("backend 'switch' is not built yet"); }
}  // namespace xagg::backends
