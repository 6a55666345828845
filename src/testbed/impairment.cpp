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

LossCounters& LossCounters::operator+=(const LossCounters& other) {
  seen += other.seen;
  dropped += other.dropped;
  drop_events += other.drop_events;
  multi_frame_skbs += other.multi_frame_skbs;
  return *this;
}

LossCounters LossCounters::operator-(const LossCounters& earlier) const {
  return {seen - earlier.seen, dropped - earlier.dropped, drop_events - earlier.drop_events,
          multi_frame_skbs - earlier.multi_frame_skbs};
}

LossCounters LinkLoss::counters() const {
  const auto& bss = *program_->bss;
  return {__atomic_load_n(&bss.frames_seen, __ATOMIC_RELAXED), __atomic_load_n(&bss.frames_dropped, __ATOMIC_RELAXED),
          __atomic_load_n(&bss.drop_events, __ATOMIC_RELAXED),
          __atomic_load_n(&bss.multi_frame_skbs, __ATOMIC_RELAXED)};
}

LinkLossPair::LinkLossPair(const HostLink& link, double rate)
    : from_host(link.bridge_netns, link.bridge_port, rate, LinkEnd::Ingress),
      to_host(link.bridge_netns, link.bridge_port, rate, LinkEnd::Egress) {}

Impairment::Impairment(const Testbed& testbed, uint32_t workers, double rate) {
  const Layout layout = testbed.layout();
  std::vector<HostRef> hosts;
  for (uint32_t k = 0; !layout.colocated && k < layout.aggregators; ++k)
    hosts.push_back({HostRef::Role::Aggregator, k});
  for (uint32_t i = 0; i < workers; ++i) hosts.push_back({HostRef::Role::Worker, i});
  for (const HostRef& host : hosts)
    links_.emplace_back(host, std::make_unique<LinkLossPair>(testbed.link_of(host), rate));
}

void Impairment::set_rate(double rate) {
  for (auto& [host, link] : links_) {
    link->from_host.set_rate(rate);
    link->to_host.set_rate(rate);
  }
}

LossCounters Impairment::counters() const {
  LossCounters total;
  for (const LinkLossReport& link : per_link()) {
    total += link.from_host;
    total += link.to_host;
  }
  return total;
}

std::vector<LinkLossReport> Impairment::per_link() const {
  std::vector<LinkLossReport> reports;
  for (const auto& [host, link] : links_) reports.push_back({host, link->from_host.counters(), link->to_host.counters()});
  return reports;
}

namespace {

nlohmann::json to_json(const LossCounters& counters) {
  return {{"frames", counters.seen},
          {"frames_lost", counters.dropped},
          {"loss_events", counters.drop_events},
          {"multi_frame_skbs", counters.multi_frame_skbs},
          {"rate", counters.rate()}};
}

}  // namespace

nlohmann::json Impairment::report() const {
  nlohmann::json links = nlohmann::json::array();
  for (const LinkLossReport& link : per_link())
    links.push_back(
        {{"link", link.host.to_string()}, {"from_host", to_json(link.from_host)}, {"to_host", to_json(link.to_host)}});
  nlohmann::json report = to_json(counters());
  report["links"] = std::move(links);
  return report;
}

}  // namespace xagg::testbed
