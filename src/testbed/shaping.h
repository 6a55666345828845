// Per-link bandwidth in the testbed (tbf; netem is not available). A worker's
// link is shaped in both directions: its own eth0 egress (towards the bridge)
// and the bridge port towards it. Each dedicated aggregator's link is shaped
// on the bridge port towards it and, for the other direction, on the same
// port's ingress (redirected through an ifb device): frames the aggregator
// sends by XDP (XAgg's and the switch baseline's results) bypass its own eth0
// qdiscs, so only there does every system's traffic pay the same rate.
//
// Co-located (testbed.h): a host's one link to the switch carries its worker's
// and its aggregator's traffic, so the worker's rate applies to the host's
// uplink: "up" egress in <p>-hI and br0 port "wI" egress in <p>-sw. Frames the
// aggregator sends by XDP pass the host's internal switch and so the uplink's
// qdisc; traffic between a host's worker and aggregator stays unshaped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "testbed.h"

namespace xagg::testbed {

struct LinkRates {
  std::vector<double> aggregator_gbit;  // per dedicated aggregator index; missing or 0: unshaped
  std::vector<double> worker_gbit;      // per worker index (co-located: per host); missing or 0: unshaped
};

// The bucket of a link shaped to gbit: after an idle spell tbf passes that
// many bytes at once, then the rate.
uint64_t burst_bytes(double gbit);

// What tbf queues on a link shaped to gbit before it drops: the bucket and
// the queueing delay the shaping allows (its `latency`).
uint64_t queue_limit_bytes(double gbit);

// The ifb device that shapes what arrives on `interface` (its ingress).
std::string ingress_device(const std::string& interface);

// A device whose egress tbf shapes one direction of a link.
struct ShapedDevice {
  std::string netns;
  std::string device;
};

// Where each direction of a host's link (Testbed::link_of) is shaped: what
// leaves the host on its own interface (a dedicated aggregator's: on the ifb
// of its bridge port's ingress), what reaches it on the bridge port.
struct LinkDevices {
  ShapedDevice from_host;
  ShapedDevice to_host;
};
LinkDevices shaped_devices(const Testbed& testbed, HostRef host);

// Installs the tbf qdiscs; removes them on destruction (the namespaces may be gone).
// Throws std::invalid_argument for rates of aggregators the testbed does not have
// (any, when co-located: worker_gbit sets a host's link).
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
    bool created_clsact = false;  // ingress shaping: remove the qdisc too
  };
  void shape(const ShapedDevice& device, double gbit);
  void shape_ingress(const std::string& netns, const std::string& interface, double gbit);
  static constexpr int kRedirectPriority = 2;  // after a loss filter (priority 1)
  void remove_all();

  std::vector<ShapedInterface> shaped_;
  std::vector<ShapedInterface> shaped_ingress_;  // the interface; its ifb is ingress_device(interface)
};

}  // namespace xagg::testbed
