// Per-link bandwidth in the testbed (tbf; netem is not available). A worker's
// link is shaped in both directions: its own eth0 egress (towards the bridge)
// and the bridge port towards it. The aggregator's link is shaped on the
// bridge port towards it and on its eth0 egress; XDP_TX bypasses the latter,
// so the XDP systems' results are limited only by each worker's bridge port.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "testbed.h"

namespace xagg::testbed {

struct LinkRates {
  double aggregator_gbit = 0;        // 0: unshaped
  std::vector<double> worker_gbit;  // per worker index; missing or 0: unshaped
};

// The bucket of a link shaped to gbit: after an idle spell tbf passes that
// many bytes at once, then the rate.
uint64_t burst_bytes(double gbit);

// Installs the tbf qdiscs; removes them on destruction (the namespaces may be gone).
class Shaping {
 public:
  Shaping(const Testbed& testbed, const LinkRates& rates);
  ~Shaping();
  Shaping(const Shaping&) = delete;
  Shaping& operator=(const Shaping&) = delete;

 private:
  struct ShapedInterface {
    std::string netns;
    std::string interface;
  };
  void shape(const std::string& netns, const std::string& interface, double gbit);
  void remove_all();

  std::vector<ShapedInterface> shaped_;
};

}  // namespace xagg::testbed
