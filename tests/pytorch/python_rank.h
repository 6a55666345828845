// What the PyTorch tests share: their preconditions, and one rank of a rank
// script (testbed_rank.py's arguments) started in its worker namespace under
// Debian's /usr/bin/python3 with xagg_torch on the path.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "testbed.h"

namespace xagg::testbed {

inline ::testing::AssertionResult can_run_pytorch_tests() {
  if (geteuid() != 0) return ::testing::AssertionFailure() << "the PyTorch tests need root (network namespaces, XDP)";
  if (!std::filesystem::exists(XAGG_TORCH_DIR "/xagg_torch/__init__.py"))
    return ::testing::AssertionFailure() << "xagg_torch is not built: build the xagg_torch target";
  return ::testing::AssertionSuccess();
}

inline ProcessSpec python_rank(const Testbed& testbed, const char* script, uint32_t rank, uint32_t world_size,
                               const std::vector<std::string>& extra_arguments = {}) {
  std::vector<std::string> argv = {"ip",
                                   "netns",
                                   "exec",
                                   testbed.worker(rank).netns,
                                   "env",
                                   "PYTHONPATH=" XAGG_TORCH_DIR,
                                   "/usr/bin/python3",
                                   script,
                                   "--rank",
                                   std::to_string(rank),
                                   "--world-size",
                                   std::to_string(world_size),
                                   "--master",
                                   testbed.worker(0).address,
                                   "--aggregator",
                                   fmt::format("{}", fmt::join(testbed.aggregator_addresses(), ","))};
  argv.insert(argv.end(), extra_arguments.begin(), extra_arguments.end());
  return ProcessSpec{.argv = std::move(argv), .netns = std::nullopt, .output_file = std::nullopt};
}

}  // namespace xagg::testbed
