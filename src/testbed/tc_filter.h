// A BPF program attached as a cls_bpf filter to one end (clsact egress or
// ingress) of an interface inside a testbed namespace: the loss filter and
// the ECN marker. Removed on destruction, with the clsact qdisc if it created
// it; the namespace may already be gone.
#pragma once

#include <fmt/format.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

namespace xagg::testbed {

enum class LinkEnd { Egress, Ingress };

class TcFilter {
 public:
  // Filters on one hook run in priority order; one priority holds one filter (attaching replaces it).
  TcFilter(std::string netns, std::string interface, LinkEnd end, int prog_fd, uint32_t priority);
  ~TcFilter();
  TcFilter(const TcFilter&) = delete;
  TcFilter& operator=(const TcFilter&) = delete;

  const std::string& netns() const { return netns_; }
  const std::string& interface() const { return interface_; }

 private:
  std::string netns_;
  std::string interface_;
  LinkEnd end_;
  uint32_t priority_;
  int ifindex_ = 0;
  bool created_qdisc_ = false;
};

// A loaded libbpf skeleton with its program attached through a TcFilter:
// the filter is removed before the program is destroyed.
template <typename Skeleton>
class AttachedSkeleton {
 public:
  using Destroy = void (*)(Skeleton*);
  // Takes the result of <name>__open_and_load(); throws naming `what` when it is null.
  AttachedSkeleton(Skeleton* skeleton, Destroy destroy, const char* what) : skeleton_(skeleton, destroy) {
    if (!skeleton_) throw std::runtime_error(fmt::format("loading {}: {}", what, std::strerror(errno)));
  }
  void attach(std::string netns, std::string interface, LinkEnd end, int prog_fd, uint32_t priority) {
    filter_ = std::make_unique<TcFilter>(std::move(netns), std::move(interface), end, prog_fd, priority);
  }
  Skeleton* operator->() const { return skeleton_.get(); }
  const TcFilter& filter() const { return *filter_; }

 private:
  std::unique_ptr<Skeleton, Destroy> skeleton_;
  std::unique_ptr<TcFilter> filter_;  // declared after the skeleton: destroyed first
};

}  // namespace xagg::testbed
