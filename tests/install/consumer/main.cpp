// Built against an installed libxagg, by CMake and by pkg-config (tests/install):
// the installed headers compile, the installed libraries link, and both compute.
#include <xagg/communicator.h>
#include <xagg/quantize.h>
#include <xagg/secret.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

int main() {
  const std::vector<float> values = {0.5f, -1.25f, 3.0f, 0.0f, 1e-3f};
  constexpr uint32_t kWorldSize = 4;
  const int32_t exponent = xagg::quant::chunk_exponent(values);
  std::vector<int32_t> quantized(values.size());
  xagg::quant::quantize(values, exponent, kWorldSize, quantized);
  std::vector<float> restored(values.size());
  xagg::quant::dequantize(quantized, exponent, kWorldSize, 1.0, restored);
  if (exponent != 2) return std::fprintf(stderr, "chunk_exponent: %d, not 2\n", exponent), 1;
  for (size_t i = 0; i < values.size(); ++i)
    if (std::abs(restored[i] - values[i]) > xagg::quant::error_bound(exponent, kWorldSize))
      return std::fprintf(stderr, "element %zu: %g came back as %g\n", i, values[i], restored[i]), 1;

  // Refused before any connection is tried.
  xagg::CommunicatorConfig config;
  config.aggregators = {"198.18.0.1", "198.18.0.1"};
  config.job_id = 1;
  config.world_size = kWorldSize;
  config.max_elements = values.size();
  try {
    xagg::Communicator communicator(config);
    return std::fprintf(stderr, "a Communicator with an aggregator listed twice was constructed\n"), 1;
  } catch (const xagg::ConfigError& error) {
    if (std::string(error.what()).find("listed twice") == std::string::npos)
      return std::fprintf(stderr, "unexpected ConfigError: %s\n", error.what()), 1;
  }
  try {
    xagg::read_secret_file("/nonexistent/xagg-secret");
    return std::fprintf(stderr, "a missing secret file was read\n"), 1;
  } catch (const std::runtime_error& error) {
    if (std::string(error.what()).find("/nonexistent/xagg-secret") == std::string::npos)
      return std::fprintf(stderr, "unexpected error: %s\n", error.what()), 1;
  }
  std::puts("libxagg: quantization round trip, configuration and secret file checks ok");
  return 0;
}
