// libFuzzer target for the control plane (see control_fuzz_harness.h):
//   build-rel/tests/reliability/control_fuzzer -max_total_time=600 corpus/
// Any invariant violation aborts with the violations printed.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>

#include "control_fuzz_harness.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // refusals are expected and frequent
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto violations = xagg::reliability::run_control_input({reinterpret_cast<const char*>(data), size});
  for (const auto& violation : violations) std::fprintf(stderr, "violation: %s\n", violation.c_str());
  if (!violations.empty()) std::abort();
  return 0;
}
