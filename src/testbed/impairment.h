// Random packet loss on testbed links (netem is not available): a cls_bpf
// program (bpf/xagg_loss.bpf.c) on each direction of every link, placed where
// every system's frames pass. Frames an aggregator sends by XDP (XAgg's and
// the switch baseline's results) bypass its own eth0 qdiscs, so a dedicated
// aggregator link's downward direction is cut at the bridge's ingress:
//
//   worker -> aggregator k: worker eth0 egress, then bridge port "agg{k}" egress
//   aggregator k -> worker: bridge port "agg{k}" ingress, then bridge port "wI" egress
//
// Co-located (testbed.h), a host's uplink carries all its traffic and is cut
// on "up" egress in <p>-hI and on br0 port "wI" egress; traffic between a
// host's worker and its aggregator crosses no link and is never dropped.
//
// Every frame is dropped with the set probability, whatever its protocol.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tc_filter.h"
#include "testbed.h"
#include "wire.h"

struct xagg_loss_bpf;

namespace xagg::testbed {

struct LossCounters {
  uint64_t seen = 0;
  uint64_t dropped = 0;
  double rate() const { return seen ? double(dropped) / double(seen) : 0.0; }
};

// Loss on one interface's egress or ingress. Removes its filter (and the
// clsact qdisc if it created it) on destruction; the namespace may already be gone.
class LinkLoss {
 public:
  LinkLoss(std::string netns, std::string interface, double rate, LinkEnd end = LinkEnd::Egress);

  // 0 passes everything, 1 drops everything; takes effect for the next frame.
  void set_rate(double rate);
  // Also drops the next `count` XAgg packets of this type whose chunk field
  // (the aggregator's own index) is `chunk`, whatever the rate; 0 disarms.
  void drop_next(wire::MsgType type, uint32_t chunk, uint32_t count = 1);
  // How many of those drops are still to come.
  int64_t targeted_drops_left() const;
  LossCounters counters() const;
  const std::string& netns() const { return program_.filter().netns(); }
  const std::string& interface() const { return program_.filter().interface(); }

 private:
  AttachedSkeleton<xagg_loss_bpf> program_;
};

// The same loss rate on every link of a testbed (in its layout), both directions.
class Impairment {
 public:
  Impairment(const Testbed& testbed, uint32_t workers, double rate);

  void set_rate(double rate);
  // Sums over every link end.
  LossCounters counters() const;

 private:
  std::vector<std::unique_ptr<LinkLoss>> links_;
};

}  // namespace xagg::testbed
