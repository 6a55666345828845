// Placeholder until the gloo baseline lands.
#include "backend.h"

namespace xagg::backends {
std::unique_ptr<Backend> make_gloo_backend(const BackendConfig&) { throw ConfigError("backend 'gloo' is not built yet"); }
}  // namespace xagg::backends
