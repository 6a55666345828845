// Shared by the end-to-end tests: they create namespaces and load XDP, so root is required.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <iostream>

#include "cluster.h"

namespace xagg::e2e {

// Fails (never skips): a suite that silently skips would hide a broken CI setup.
inline void require_root() {
  ASSERT_EQ(geteuid(), 0u) << "the end-to-end tests create network namespaces and attach XDP programs: run them as root";
}

// A fresh testbed and aggregator for every test; the aggregator's output is
// shown when the test failed, and everything is removed afterwards.
template <class Param>
class ClusterTest : public ::testing::TestWithParam<Param> {
 protected:
  void start(uint32_t workers, testbed::AggregatorKind kind = testbed::AggregatorKind::Xdp) {
    require_root();
    bed_.up(workers);
    cluster_.start_aggregator(testbed::Clock::now() + std::chrono::seconds(30), kind);
  }

  void TearDown() override {
    testbed::ProcessResult aggregator = cluster_.stop_aggregator();
    if (this->HasFailure()) std::cerr << "aggregator output:\n" << aggregator.output << "\n";
    bed_.down();
  }

  testbed::Testbed bed_{"xagg-e2e"};
  testbed::Cluster cluster_{XAGG_BINARY, bed_};
};

}  // namespace xagg::e2e
