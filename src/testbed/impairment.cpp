#include "impairment.h"

#include <bpf/libbpf.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "xagg_loss.skel.h"

namespace xagg::testbed {
namespace {

uint64_t threshold_for(double rate) {
  if (!(rate >= 0.0 && rate <= 1.0)) throw std::invalid_argument(fmt::format("loss rate {} is not in 0..1", rate));
  return static_cast<uint64_t>(std::llround(rate * 0x1p32));
}

// First on its hook: a dropped frame never reaches the ECN marker or the ingress shaping.
constexpr uint32_t kLossPriority = 1;

}  // namespace

LinkLoss::LinkLoss(std::string netns, std::string interface, double rate, LinkEnd end)
    : program_(xagg_loss_bpf__open_and_load(), &xagg_loss_bpf__destroy, "the loss program") {
  program_->bss->drop_threshold = threshold_for(rate);
  program_.attach(std::move(netns), std::move(interface), end, bpf_program__fd(program_->progs.xagg_loss),
                  kLossPriority);
  spdlog::debug("loss {:.4f} on {} {} in {}", rate, this->interface(), end == LinkEnd::Egress ? "egress" : "ingress",
                this->netns());
}

void LinkLoss::set_rate(double rate) { program_->bss->drop_threshold = threshold_for(rate); }

void LinkLoss::drop_next(wire::MsgType type, uint32_t chunk, uint32_t count) {
  __atomic_store_n(&program_->bss->targeted_drops, 0, __ATOMIC_SEQ_CST);  // no match on a half-written target
  program_->bss->target_type = static_cast<uint32_t>(type);
  program_->bss->target_chunk = chunk;
  __atomic_store_n(&program_->bss->targeted_drops, int64_t{count}, __ATOMIC_SEQ_CST);
}

int64_t LinkLoss::targeted_drops_left() const {
  return std::max<int64_t>(0, __atomic_load_n(&program_->bss->targeted_drops, __ATOMIC_RELAXED));
}

LossCounters LinkLoss::counters() const {
  return {__atomic_load_n(&program_->bss->frames_seen, __ATOMIC_RELAXED),
          __atomic_load_n(&program_->bss->frames_dropped, __ATOMIC_RELAXED)};
}

Impairment::Impairment(const Testbed& testbed, uint32_t workers, double rate) {
  const Layout layout = testbed.layout();
  for (uint32_t k = 0; !layout.colocated && k < layout.aggregators; ++k) {
    const HostLink aggregator = testbed.aggregator(k);
    links_.push_back(
        std::make_unique<LinkLoss>(aggregator.bridge_netns, aggregator.bridge_port, rate, LinkEnd::Ingress));
    links_.push_back(std::make_unique<LinkLoss>(aggregator.bridge_netns, aggregator.bridge_port, rate));
  }
  for (uint32_t i = 0; i < workers; ++i) {
    const HostLink link = testbed.worker_link(i);
    links_.push_back(std::make_unique<LinkLoss>(link.netns, link.interface, rate));
    links_.push_back(std::make_unique<LinkLoss>(link.bridge_netns, link.bridge_port, rate));
  }
}

void Impairment::set_rate(double rate) {
  for (auto& link : links_) link->set_rate(rate);
}

LossCounters Impairment::counters() const {
  LossCounters total;
  for (const auto& link : links_) {
    LossCounters one = link->counters();
    total.seen += one.seen;
    total.dropped += one.dropped;
  }
  return total;
}

}  // namespace xagg::testbed
