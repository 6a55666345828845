#include "testbed.h"

#include <arpa/inet.h>
#include <bpf/libbpf.h>
#include <fmt/format.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <system_error>
#include <thread>

#include "netns.h"
#include "shaping.h"
#include "xagg_pass.skel.h"

namespace xagg::testbed {
namespace {

const std::filesystem::path kNetnsDir = "/run/netns";

bool netns_exists(const std::string& name) { return std::filesystem::exists(kNetnsDir / name); }

bool link_exists(const std::string& netns, const std::string& device) {
  return try_command({"ip", "-n", netns, "link", "show", "dev", device});
}

// Removes the shaping and loss filters an interrupted run left on a link end,
// so that a reused testbed starts unshaped and lossless.
void clear_qdiscs(const std::string& netns, const std::string& device) {
  for (const char* qdisc : {"root", "clsact"})
    try_command({"ip", "netns", "exec", netns, "tc", "qdisc", "del", "dev", device, qdisc});
}

void ensure_netns(const std::string& name) {
  if (!netns_exists(name)) run_command({"ip", "netns", "add", name});
  run_command({"ip", "-n", name, "link", "set", "lo", "up"});
}

void sysctl(const std::string& netns, const std::string& setting) {
  run_command({"ip", "netns", "exec", netns, "sysctl", "-q", "-w", setting});
}

}  // namespace

Testbed::Testbed(std::string prefix) : prefix_(std::move(prefix)) {
  if (prefix_.empty() || prefix_.find('/') != std::string::npos)
    throw std::invalid_argument(fmt::format("bad testbed prefix '{}'", prefix_));
}

HostLink Testbed::aggregator() const { return {prefix_ + "-agg", "agg", kAggregatorAddress}; }

HostLink Testbed::worker(uint32_t index) const {
  if (index >= 254) throw std::out_of_range("the testbed addresses at most 254 workers");
  return {fmt::format("{}-w{}", prefix_, index), fmt::format("w{}", index), fmt::format("198.18.1.{}", index + 1)};
}

std::vector<std::string> Testbed::existing_namespaces() const {
  // Exactly <prefix>-sw, -agg or -w<digits>: prefix "xagg" must not match "xagg-e2e-sw".
  std::string escaped = std::regex_replace(prefix_, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
  std::regex ours(escaped + R"(-(sw|agg|w[0-9]+))");
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(kNetnsDir, error)) {
    std::string name = entry.path().filename();
    if (std::regex_match(name, ours)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::optional<uint32_t> Testbed::existing_workers() const {
  if (!netns_exists(switch_netns())) return std::nullopt;
  auto names = existing_namespaces();
  uint32_t count = 0;
  while (count < 254 && std::find(names.begin(), names.end(), worker(count).netns) != names.end()) ++count;
  return count;
}

void Testbed::up(uint32_t workers) {
  if (workers == 0 || workers > 64) throw std::invalid_argument("workers must be 1..64");
  auto existing = existing_workers();
  auto namespaces = existing_namespaces();
  // Extra worker namespaces (w{N}..) or a different count: rebuild from scratch.
  size_t expected = workers + 2;
  if ((existing && *existing != workers) || (!namespaces.empty() && namespaces.size() > expected)) {
    spdlog::info("testbed {}: rebuilding for {} workers", prefix_, workers);
    down();
  }
  raise_backlog();
  set_up_switch();
  connect(aggregator());
  attach_pass_stub(aggregator());
  for (uint32_t i = 0; i < workers; ++i) connect(worker(i));
  spdlog::info("testbed {}: up with {} workers", prefix_, workers);
}

void Testbed::raise_backlog() {
  // Every veth hands received frames to the per-CPU backlog queue, which
  // holds net.core.netdev_max_backlog frames (1000 by default) for ALL
  // namespaces. One XDP_TX burst of results flooded to every worker port
  // overflows it and the frames are lost (column 2 of /proc/net/softnet_stat).
  // The setting is host-wide and is raised, never lowered.
  std::ifstream current("/proc/sys/net/core/netdev_max_backlog");
  uint64_t backlog = 0;
  current >> backlog;
  if (backlog < kMinBacklog) {
    run_command({"sysctl", "-q", "-w", fmt::format("net.core.netdev_max_backlog={}", kMinBacklog)});
    spdlog::info("testbed: raised net.core.netdev_max_backlog from {} to {}", backlog, kMinBacklog);
  }
}

void Testbed::set_up_switch() {
  std::string sw = switch_netns();
  ensure_netns(sw);
  if (!link_exists(sw, kBridge)) run_command({"ip", "-n", sw, "link", "add", kBridge, "type", "bridge"});
  // Forward at once (no STP listening delay) and flood multicast/broadcast to every port.
  run_command({"ip", "-n", sw, "link", "set", kBridge, "type", "bridge", "stp_state", "0", "forward_delay", "0",
               "mcast_snooping", "0"});
  run_command({"ip", "-n", sw, "link", "set", kBridge, "mtu", std::to_string(kLinkMtu), "up"});
}

void Testbed::connect(const HostLink& host) {
  std::string sw = switch_netns();
  std::string mtu = std::to_string(kLinkMtu);
  ensure_netns(host.netns);
  if (!link_exists(sw, host.bridge_port)) {
    run_command({"ip", "-n", sw, "link", "add", host.bridge_port, "mtu", mtu, "type", "veth", "peer", "name",
                 kHostInterface, "netns", host.netns, "mtu", mtu});
  } else {
    clear_qdiscs(sw, host.bridge_port);
    clear_qdiscs(host.netns, kHostInterface);
    try_command({"ip", "-n", sw, "link", "del", ingress_device(host.bridge_port)});
  }
  run_command({"ip", "-n", sw, "link", "set", host.bridge_port, "mtu", mtu, "master", kBridge, "up"});

  // Results come back as directed broadcasts from XDP: never drop them on
  // reverse-path checks, and let hosts answer broadcast pings for diagnosis.
  sysctl(host.netns, "net.ipv4.conf.all.rp_filter=0");
  sysctl(host.netns, fmt::format("net.ipv4.conf.{}.rp_filter=0", kHostInterface));
  sysctl(host.netns, "net.ipv4.icmp_echo_ignore_broadcasts=0");
  run_command({"ip", "-n", host.netns, "link", "set", kHostInterface, "mtu", mtu, "up"});
  // `brd +` derives 198.18.255.255 so the directed broadcast is local to every host.
  run_command({"ip", "-n", host.netns, "addr", "replace", fmt::format("{}/{}", host.address, kPrefixLength), "brd",
               "+", "dev", kHostInterface});
}

void Testbed::attach_pass_stub(const HostLink& host) {
  // veth delivers the aggregator's XDP_TX frames only when the peer runs XDP too.
  run_in_netns(switch_netns(), [&] {
    unsigned ifindex = if_nametoindex(host.bridge_port.c_str());
    if (ifindex == 0) throw std::runtime_error(fmt::format("no device {} in {}", host.bridge_port, switch_netns()));
    uint32_t attached_id = 0;
    if (bpf_xdp_query_id(static_cast<int>(ifindex), XDP_FLAGS_DRV_MODE, &attached_id) == 0 && attached_id != 0)
      return;
    std::unique_ptr<xagg_pass_bpf, decltype(&xagg_pass_bpf__destroy)> skeleton(xagg_pass_bpf__open_and_load(),
                                                                              &xagg_pass_bpf__destroy);
    if (!skeleton) throw std::runtime_error(fmt::format("cannot load the XDP pass stub: {}", strerror(errno)));
    // The netlink attachment keeps the program alive after the skeleton is closed.
    int rc = bpf_xdp_attach(static_cast<int>(ifindex), bpf_program__fd(skeleton->progs.xagg_pass),
                            XDP_FLAGS_DRV_MODE, nullptr);
    if (rc < 0)
      throw std::runtime_error(
          fmt::format("cannot attach the XDP pass stub to {}: {}", host.bridge_port, strerror(-rc)));
  });
}

void Testbed::down() {
  // The switch first: deleting it destroys the veth pairs and the XDP stub with them.
  auto names = existing_namespaces();
  std::stable_partition(names.begin(), names.end(), [&](const auto& name) { return name == switch_netns(); });
  for (const auto& name : names) run_command({"ip", "netns", "delete", name});
  if (!names.empty()) spdlog::info("testbed {}: removed {} namespaces", prefix_, names.size());
}

void run_in_netns(const std::string& netns, const std::function<void()>& fn) {
  std::exception_ptr error;
  std::thread thread([&] {
    try {
      enter_netns(netns);
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  });
  thread.join();
  if (error) std::rethrow_exception(error);
}

bool tcp_port_open(const std::string& netns, const std::string& address, uint16_t port) {
  bool open = false;
  run_in_netns(netns, [&] {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "socket");
    sockaddr_in target{};
    target.sin_family = AF_INET;
    target.sin_port = htons(port);
    inet_pton(AF_INET, address.c_str(), &target.sin_addr);
    open = ::connect(fd, reinterpret_cast<sockaddr*>(&target), sizeof target) == 0;
    close(fd);
  });
  return open;
}

void wait_for_tcp_port(const std::string& netns, const std::string& address, uint16_t port, Process& server,
                       Clock::time_point deadline) {
  while (!tcp_port_open(netns, address, port)) {
    if (auto code = server.poll())
      throw std::runtime_error(fmt::format("`{}` exited {} before listening on {}:{}:\n{}", server.name(), *code,
                                           address, port, server.output()));
    if (Clock::now() >= deadline)
      throw std::runtime_error(fmt::format("`{}` did not listen on {}:{} in time:\n{}", server.name(), address,
                                           port, server.output()));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

TeardownGuard::~TeardownGuard() {
  try {
    testbed_.down();
  } catch (const std::exception& error) {
    spdlog::error("testbed {}: teardown failed: {}", testbed_.prefix(), error.what());
  }
}

}  // namespace xagg::testbed
