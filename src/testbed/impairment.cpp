#include "impairment.h"

#include <bpf/libbpf.h>
#include <fmt/format.h>
#include <net/if.h>
#include <spdlog/spdlog.h>

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

bpf_tc_hook tc_hook(int ifindex, LinkEnd end) {
  bpf_tc_hook hook{};
  hook.sz = sizeof(hook);
  hook.ifindex = ifindex;
  hook.attach_point = end == LinkEnd::Egress ? BPF_TC_EGRESS : BPF_TC_INGRESS;
  return hook;
}

const char* end_name(LinkEnd end) { return end == LinkEnd::Egress ? "egress" : "ingress"; }

bpf_tc_opts filter_opts(int prog_fd) {
  bpf_tc_opts opts{};
  opts.sz = sizeof(opts);
  opts.handle = 1;
  opts.priority = 1;
  opts.prog_fd = prog_fd;
  return opts;
}

}  // namespace

void LinkLoss::SkeletonDeleter::operator()(xagg_loss_bpf* skeleton) const { xagg_loss_bpf__destroy(skeleton); }

LinkLoss::LinkLoss(std::string netns, std::string interface, double rate, LinkEnd end)
    : netns_(std::move(netns)), interface_(std::move(interface)), end_(end) {
  uint64_t threshold = threshold_for(rate);
  skeleton_.reset(xagg_loss_bpf__open_and_load());
  if (!skeleton_) throw std::runtime_error(fmt::format("loading the loss program: {}", std::strerror(errno)));
  skeleton_->bss->drop_threshold = threshold;
  run_in_netns(netns_, [&] {
    ifindex_ = static_cast<int>(if_nametoindex(interface_.c_str()));
    if (ifindex_ == 0) throw std::runtime_error(fmt::format("no interface {} in {}", interface_, netns_));
    bpf_tc_hook hook = tc_hook(ifindex_, end_);
    int rc = bpf_tc_hook_create(&hook);
    if (rc < 0 && rc != -EEXIST)
      throw std::runtime_error(fmt::format("adding clsact to {} in {}: {}", interface_, netns_, std::strerror(-rc)));
    created_qdisc_ = rc == 0;
    bpf_tc_opts opts = filter_opts(bpf_program__fd(skeleton_->progs.xagg_loss));
    opts.flags = BPF_TC_F_REPLACE;
    rc = bpf_tc_attach(&hook, &opts);
    if (rc < 0)
      throw std::runtime_error(
          fmt::format("attaching the loss filter to {} in {}: {}", interface_, netns_, std::strerror(-rc)));
  });
  spdlog::debug("loss {:.4f} on {} {} in {}", rate, interface_, end_name(end_), netns_);
}

LinkLoss::~LinkLoss() {
  try {
    run_in_netns(netns_, [&] {
      bpf_tc_hook hook = tc_hook(ifindex_, end_);
      if (created_qdisc_) {
        hook.attach_point = static_cast<bpf_tc_attach_point>(BPF_TC_INGRESS | BPF_TC_EGRESS);  // the clsact qdisc
        bpf_tc_hook_destroy(&hook);
      } else {
        bpf_tc_opts opts = filter_opts(0);
        bpf_tc_detach(&hook, &opts);
      }
    });
  } catch (const std::exception& error) {  // the namespace went first: its links are gone with it
    spdlog::debug("loss on {} in {}: {}", interface_, netns_, error.what());
  }
}

void LinkLoss::set_rate(double rate) { skeleton_->bss->drop_threshold = threshold_for(rate); }

LossCounters LinkLoss::counters() const {
  return {__atomic_load_n(&skeleton_->bss->frames_seen, __ATOMIC_RELAXED),
          __atomic_load_n(&skeleton_->bss->frames_dropped, __ATOMIC_RELAXED)};
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
