// Random packet loss on testbed links (netem is not available): a cls_bpf
// program (bpf/xagg_loss.bpf.c) on each direction of every link, at the
// link's switch end, where every system's frames pass one wire frame per skb
// (every veth segments before it transmits: testbed.h). Frames an aggregator
// sends by XDP bypass its own qdiscs, and a host's own egress still sees its
// stack's 64 KB GSO packets, so both directions are cut at the bridge port:
//
//   host -> switch: the host's bridge port, ingress
//   switch -> host: the host's bridge port, egress
//
// for every worker's link and every dedicated aggregator's. Co-located
// (testbed.h), a host's uplink carries all its traffic and is cut at its br0
// port "wI"; traffic between a host's worker and its aggregator crosses no
// link and is never dropped.
//
// Every wire frame is lost independently with the set probability, whatever
// its protocol, so a TCP sender and an XAgg sender meet the same loss per frame.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tc_filter.h"
#include "testbed.h"
#include "wire.h"

struct xagg_loss_bpf;

namespace xagg::testbed {

// In wire frames, except where named.
struct LossCounters {
  uint64_t seen = 0;
  uint64_t dropped = 0;
  uint64_t drop_events = 0;       // skbs dropped: one loss event each
  uint64_t multi_frame_skbs = 0;  // skbs of several frames seen (none where the testbed places its filters)
  double rate() const { return seen ? double(dropped) / double(seen) : 0.0; }
  double events_per_frame() const { return seen ? double(drop_events) / double(seen) : 0.0; }
  LossCounters& operator+=(const LossCounters& other);
  LossCounters operator-(const LossCounters& earlier) const;
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

// Both directions of one host's link, at its switch end.
struct LinkLossPair {
  LinkLossPair(const HostLink& link, double rate);
  LinkLoss from_host;  // the bridge port's ingress
  LinkLoss to_host;    // the bridge port's egress
};

// The counters of one host's link, for reports.
struct LinkLossReport {
  HostRef host;
  LossCounters from_host;
  LossCounters to_host;
};

// The same loss rate on every link of a testbed (in its layout), both directions.
class Impairment {
 public:
  Impairment(const Testbed& testbed, uint32_t workers, double rate);

  void set_rate(double rate);
  // Sums over every link end.
  LossCounters counters() const;
  std::vector<LinkLossReport> per_link() const;
  // The sums and every link's two directions, in wire frames, for benchmark and training reports.
  nlohmann::json report() const;

 private:
  std::vector<std::pair<HostRef, std::unique_ptr<LinkLossPair>>> links_;
};

}  // namespace xagg::testbed
