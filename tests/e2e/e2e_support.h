// Shared by the end-to-end tests: they create namespaces and load XDP, so root is required.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

namespace xagg::e2e {

// Fails (never skips): a suite that silently skips would hide a broken CI setup.
inline void require_root() {
  ASSERT_EQ(geteuid(), 0u) << "the end-to-end tests create network namespaces and attach XDP programs: run them as root";
}

}  // namespace xagg::e2e
