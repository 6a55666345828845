// ECN marking on testbed links (the kernel has no RED or CoDel): the cls_bpf
// phantom-queue marker of bpf/xagg_ecn.bpf.c on the device whose tbf shapes a
// direction of a link (shaping.h, shaped_devices), after any loss filter.
// It sets CE on ECT(0)/ECT(1) IPv4 packets while more than the threshold
// would be queued on a link draining at the given rate; Not-ECT packets pass
// unchanged. Only marks: a sender that reacts to CE is for the worker library.
#pragma once

#include <cstdint>

#include "shaping.h"
#include "tc_filter.h"
#include "testbed.h"

struct xagg_ecn_bpf;

namespace xagg::testbed {

struct MarkCounters {
  uint64_t seen = 0;             // wire frames (a GSO packet counts as its segments)
  uint64_t ect = 0;              // of them in ECT(0) or ECT(1) IPv4 packets: markable
  uint64_t marked = 0;           // set to CE
  uint64_t max_queue_bytes = 0;  // the phantom queue's high-water mark
  MarkCounters& operator+=(const MarkCounters& other);
};

// One direction: the egress of one shaping device.
class EcnMarker {
 public:
  // drain_gbit > 0: the phantom queue's drain rate; threshold_bytes: marks while it holds more;
  // limit_bytes: it holds no more (the real queue's limit).
  EcnMarker(const ShapedDevice& device, double drain_gbit, uint64_t threshold_bytes, uint64_t limit_bytes);
  MarkCounters counters() const;

 private:
  AttachedSkeleton<xagg_ecn_bpf> program_;
};

// Both directions of a shaped host link (Testbed::link_of), each draining at
// rate_fraction of the link's rate.
class LinkMarking {
 public:
  LinkMarking(const Testbed& testbed, HostRef link, double link_gbit, double threshold_kb, double rate_fraction);

  HostRef link() const { return link_; }
  MarkCounters from_host() const { return from_host_.counters(); }
  MarkCounters to_host() const { return to_host_.counters(); }

 private:
  HostRef link_;
  EcnMarker from_host_;
  EcnMarker to_host_;
};

}  // namespace xagg::testbed
