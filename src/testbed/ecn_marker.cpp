#include "ecn_marker.h"

#include <bpf/libbpf.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "xagg_ecn.skel.h"

namespace xagg::testbed {
namespace {

// After the loss filter (priority 1): a dropped frame never joins the queue.
constexpr uint32_t kMarkerPriority = 2;

uint64_t load(const uint64_t& counter) { return __atomic_load_n(&counter, __ATOMIC_RELAXED); }

}  // namespace

MarkCounters& MarkCounters::operator+=(const MarkCounters& other) {
  seen += other.seen;
  ect += other.ect;
  marked += other.marked;
  max_queue_bytes = std::max(max_queue_bytes, other.max_queue_bytes);
  return *this;
}

EcnMarker::EcnMarker(const ShapedDevice& device, double drain_gbit, uint64_t threshold_bytes, uint64_t limit_bytes)
    : program_(xagg_ecn_bpf__open_and_load(), &xagg_ecn_bpf__destroy, "the ECN marker") {
  if (!(drain_gbit > 0)) throw std::invalid_argument(fmt::format("ECN marker on {}: no drain rate", device.device));
  program_->bss->drain_bytes_per_s = static_cast<uint64_t>(drain_gbit * 1e9 / 8);
  program_->bss->threshold_bytes = threshold_bytes;
  program_->bss->limit_bytes = limit_bytes;
  program_.attach(device.netns, device.device, LinkEnd::Egress, bpf_program__fd(program_->progs.xagg_ecn),
                  kMarkerPriority);
  spdlog::debug("ECN marker on {} in {}: {} Gbit/s, {} bytes", device.device, device.netns, drain_gbit,
                threshold_bytes);
}

MarkCounters EcnMarker::counters() const {
  const auto& bss = *program_->bss;
  return {load(bss.frames_seen), load(bss.ect_frames), load(bss.frames_marked), load(bss.max_queue_bytes)};
}

LinkMarking::LinkMarking(const Testbed& testbed, HostRef link, double link_gbit, double threshold_kb,
                         double rate_fraction)
    : link_(link),
      from_host_(shaped_devices(testbed, link).from_host, link_gbit * rate_fraction,
                 static_cast<uint64_t>(threshold_kb * 1000), queue_limit_bytes(link_gbit)),
      to_host_(shaped_devices(testbed, link).to_host, link_gbit * rate_fraction,
               static_cast<uint64_t>(threshold_kb * 1000), queue_limit_bytes(link_gbit)) {}

}  // namespace xagg::testbed
