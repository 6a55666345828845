#include "tc_filter.h"

#include <bpf/libbpf.h>
#include <fmt/format.h>
#include <net/if.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "testbed.h"

namespace xagg::testbed {
namespace {

bpf_tc_hook tc_hook(int ifindex, LinkEnd end) {
  bpf_tc_hook hook{};
  hook.sz = sizeof(hook);
  hook.ifindex = ifindex;
  hook.attach_point = end == LinkEnd::Egress ? BPF_TC_EGRESS : BPF_TC_INGRESS;
  return hook;
}

bpf_tc_opts filter_opts(int prog_fd, uint32_t priority) {
  bpf_tc_opts opts{};
  opts.sz = sizeof(opts);
  opts.handle = 1;
  opts.priority = priority;
  opts.prog_fd = prog_fd;
  return opts;
}

// Removes the clsact qdisc of the hook's interface, with every filter on it.
void remove_clsact(bpf_tc_hook hook) {
  hook.attach_point = static_cast<bpf_tc_attach_point>(BPF_TC_INGRESS | BPF_TC_EGRESS);
  bpf_tc_hook_destroy(&hook);
}

}  // namespace

TcFilter::TcFilter(std::string netns, std::string interface, LinkEnd end, int prog_fd, uint32_t priority)
    : netns_(std::move(netns)), interface_(std::move(interface)), end_(end), priority_(priority) {
  const char* end_name = end_ == LinkEnd::Egress ? "egress" : "ingress";
  run_in_netns(netns_, [&] {
    ifindex_ = static_cast<int>(if_nametoindex(interface_.c_str()));
    if (ifindex_ == 0) throw std::runtime_error(fmt::format("no interface {} in {}", interface_, netns_));
    bpf_tc_hook hook = tc_hook(ifindex_, end_);
    int rc = bpf_tc_hook_create(&hook);
    if (rc < 0 && rc != -EEXIST)
      throw std::runtime_error(fmt::format("adding clsact to {} in {}: {}", interface_, netns_, std::strerror(-rc)));
    created_qdisc_ = rc == 0;
    bpf_tc_opts opts = filter_opts(prog_fd, priority_);
    opts.flags = BPF_TC_F_REPLACE;
    rc = bpf_tc_attach(&hook, &opts);
    if (rc < 0) {
      if (created_qdisc_) remove_clsact(hook);  // no destructor runs after a constructor throws
      throw std::runtime_error(fmt::format("attaching a filter to {} {} in {}: {}", interface_, end_name, netns_,
                                           std::strerror(-rc)));
    }
  });
}

TcFilter::~TcFilter() {
  try {
    run_in_netns(netns_, [&] {
      bpf_tc_hook hook = tc_hook(ifindex_, end_);
      if (created_qdisc_) {
        remove_clsact(hook);
      } else {
        bpf_tc_opts opts = filter_opts(0, priority_);
        bpf_tc_detach(&hook, &opts);
      }
    });
  } catch (const std::exception& error) {  // the namespace went first: its links are gone with it
    spdlog::debug("filter on {} in {}: {}", interface_, netns_, error.what());
  }
}

}  // namespace xagg::testbed
