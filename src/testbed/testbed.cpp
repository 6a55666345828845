#include "testbed.h"

#include "xagg_wire.h"

#include <arpa/inet.h>
#include <bpf/libbpf.h>
#include <fmt/format.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <netinet/in.h>
#include <linux/if_ether.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <system_error>
#include <thread>

#include "counters.h"
#include "netns.h"
#include "shaping.h"
#include "unique_fd.h"
#include "xagg_mroute.skel.h"
#include "xagg_pass.skel.h"

namespace xagg::testbed {
namespace {

const std::filesystem::path kNetnsDir = "/run/netns";
// The /16 subnets of a routed layout (only subnet A otherwise), and the router's address on each.
constexpr const char* kSubnetA = "198.18";
constexpr const char* kSubnetB = "198.19";
constexpr const char* kTwoLevelPrefix = "two-level:";
constexpr const char* kRouterA = "198.18.0.254";
constexpr const char* kRouterB = "198.19.0.254";

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

Layout Layout::parse(const std::string& text) {
  if (text == "colocated") return {.aggregators = 1, .colocated = true};
  if (text == "routed") return {.aggregators = 1, .colocated = false, .routed = true};
  if (text == "auto") return {.aggregators = 1, .colocated = false, .routed = false, .two_level = false, .automatic = true};
  if (text.starts_with(kTwoLevelPrefix)) {
    const Layout leaves = parse(text.substr(std::string_view(kTwoLevelPrefix).size()));
    if (leaves.colocated || leaves.routed || leaves.two_level || leaves.aggregators >= kMaxAggregators)
      throw std::invalid_argument(
          fmt::format("aggregators \"{}\": two-level takes 1 to {} leaves", text, kMaxAggregators - 1));
    return {.aggregators = leaves.aggregators + 1, .colocated = false, .routed = false, .two_level = true};
  }
  uint32_t count = 0;
  const char* end = text.data() + text.size();
  auto [parsed_end, error] = std::from_chars(text.data(), end, count);
  // from_chars would take "3x" as 3; a sign or blank is not a count either.
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text.front())) || error != std::errc() ||
      parsed_end != end)
    throw std::invalid_argument(
        fmt::format("aggregators \"{}\": expected a count from 1 to {}, \"colocated\", \"routed\", "
                    "\"two-level:L\" or \"auto\"",
                    text, kMaxAggregators));
  if (count < 1 || count > kMaxAggregators)
    throw std::invalid_argument(
        fmt::format("aggregators {}: must be 1..{} (or \"colocated\" or \"routed\")", count, kMaxAggregators));
  return {.aggregators = count, .colocated = false};
}

std::string Layout::to_string() const {
  if (automatic) return "auto";
  if (routed) return "routed";
  if (two_level) return fmt::format("{}{}", kTwoLevelPrefix, aggregators - 1);
  return colocated ? "colocated" : std::to_string(aggregators);
}

uint32_t Layout::ranks_per_leaf(uint32_t workers) const {
  if (!two_level) return 0;
  const uint32_t leaves = aggregators - 1;
  const uint32_t per_leaf = (workers + leaves - 1) / leaves;
  if (workers < leaves || (workers + per_leaf - 1) / per_leaf != leaves || per_leaf > XAGG_MAX_WORKERS)
    throw std::invalid_argument(fmt::format("{} workers do not fill {} leaves of at most {} ranks", workers, leaves,
                                            XAGG_MAX_WORKERS));
  return per_leaf;
}

Testbed::Testbed(std::string prefix) : prefix_(std::move(prefix)) {
  if (prefix_.empty() || prefix_.find('/') != std::string::npos)
    throw std::invalid_argument(fmt::format("bad testbed prefix '{}'", prefix_));
}

std::string Testbed::indexed_netns(const char* role, uint32_t index) const {
  return fmt::format("{}-{}{}", prefix_, role, index);
}

Layout Testbed::layout() const { return layout_ ? *layout_ : existing_layout().value_or(Layout{}); }

uint32_t Testbed::aggregator_count() const {
  Layout current = layout();
  if (!current.colocated) return current.aggregators;
  return layout_ ? workers_ : existing_workers().value_or(0);
}

HostLink Testbed::dedicated_aggregator(uint32_t index) const {
  if (index == 0) return {prefix_ + "-agg", "agg", kAggregatorAddress, kHostInterface, switch_netns()};
  return {indexed_netns("agg", index), fmt::format("agg{}", index), fmt::format("198.18.0.{}", index + 1),
          kHostInterface, switch_netns()};
}

HostLink Testbed::aggregator(uint32_t index) const {
  if (uint32_t count = aggregator_count(); index >= count)
    throw std::out_of_range(fmt::format("aggregator {}: testbed {} has {}", index, prefix_, count));
  if (!layout().colocated) return dedicated_aggregator(index);
  return {indexed_netns("a", index), "a", fmt::format("198.18.2.{}", index + 1), kHostInterface,
          indexed_netns("h", index)};
}

std::vector<std::string> Testbed::aggregator_addresses() const {
  std::vector<std::string> addresses;
  for (uint32_t i = 0, count = aggregator_count(); i < count; ++i) addresses.push_back(aggregator(i).address);
  return addresses;
}

HostLink Testbed::worker(uint32_t index) const {
  if (index >= kMaxWorkers) throw std::out_of_range(fmt::format("the testbed has at most {} workers", kMaxWorkers));
  // Routed: odd workers on subnet B, behind the router.
  const bool subnet_b = layout().routed && index % 2 == 1;
  HostLink host{indexed_netns("w", index), fmt::format("w{}", index),
                fmt::format("{}.1.{}", subnet_b ? kSubnetB : kSubnetA, index + 1), kHostInterface, switch_netns()};
  if (layout().colocated) {
    host.bridge_port = "w";
    host.bridge_netns = indexed_netns("h", index);
  }
  return host;
}

HostLink Testbed::host_uplink(uint32_t index) const {
  if (!layout().colocated) throw std::logic_error(fmt::format("testbed {} has no co-located hosts", prefix_));
  if (index >= kMaxWorkers) throw std::out_of_range(fmt::format("the testbed has at most {} workers", kMaxWorkers));
  return {indexed_netns("h", index), fmt::format("w{}", index), "", kUplinkInterface, switch_netns()};
}

HostLink Testbed::worker_link(uint32_t index) const {
  return layout().colocated ? host_uplink(index) : worker(index);
}

HostLink Testbed::host(HostRef ref) const {
  return ref.role == HostRef::Role::Worker ? worker(ref.index) : aggregator(ref.index);
}

HostLink Testbed::link_of(HostRef ref) const {
  if (ref.role == HostRef::Role::Worker) return worker_link(ref.index);
  return layout().colocated ? host_uplink(ref.index) : aggregator(ref.index);
}

HostRef HostRef::parse(const std::string& text) {
  const auto expected = [&] {
    return std::invalid_argument(fmt::format("\"{}\": expected \"worker I\" or \"aggregator K\"", text));
  };
  const size_t space = text.find(' ');
  if (space == std::string::npos) throw expected();
  const std::string role = text.substr(0, space);
  HostRef ref;
  if (role == "worker")
    ref.role = Role::Worker;
  else if (role == "aggregator")
    ref.role = Role::Aggregator;
  else
    throw expected();
  const char* begin = text.data() + space + 1;
  const char* end = text.data() + text.size();
  auto [parsed_end, error] = std::from_chars(begin, end, ref.index);
  if (begin == end || !std::isdigit(static_cast<unsigned char>(*begin)) || error != std::errc() || parsed_end != end)
    throw expected();
  return ref;
}

std::string HostRef::to_string() const {
  return fmt::format("{} {}", role == Role::Worker ? "worker" : "aggregator", index);
}

std::vector<std::string> Testbed::existing_namespaces() const {
  // Exactly <prefix>-sw, -agg, -agg<k>, -w<i>, -h<i> or -a<i>: prefix "xagg" must not match "xagg-e2e-sw".
  std::string escaped = std::regex_replace(prefix_, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
  std::regex ours(escaped + R"(-(sw|rt|agg[0-9]*|[wha][0-9]+))");
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
  uint32_t count = 0;
  while (count < kMaxWorkers && netns_exists(indexed_netns("w", count))) ++count;
  return count;
}

std::optional<Layout> Testbed::existing_layout() const {
  if (!netns_exists(switch_netns())) return std::nullopt;
  if (netns_exists(indexed_netns("h", 0)) || netns_exists(indexed_netns("a", 0)))
    return Layout{.aggregators = 1, .colocated = true};
  if (netns_exists(router_netns())) return Layout::parse("routed");
  uint32_t count = 0;
  while (count < kMaxAggregators && netns_exists(dedicated_aggregator(count).netns)) ++count;
  return Layout{.aggregators = std::max(count, 1u), .colocated = false};
}

std::vector<std::string> Testbed::expected_namespaces(uint32_t workers, const Layout& layout) const {
  std::vector<std::string> names{switch_netns()};
  if (layout.routed) names.push_back(router_netns());
  for (uint32_t i = 0; i < workers; ++i) names.push_back(indexed_netns("w", i));
  for (uint32_t i = 0; layout.colocated && i < workers; ++i)
    names.insert(names.end(), {indexed_netns("h", i), indexed_netns("a", i)});
  for (uint32_t k = 0; !layout.colocated && k < layout.aggregators; ++k)
    names.push_back(dedicated_aggregator(k).netns);
  return names;
}

std::string per_run_prefix(std::string_view base) { return fmt::format("{}{}", base, getpid()); }

void Testbed::up(uint32_t workers, Layout layout, uint32_t mtu) {
  if (workers == 0 || workers > kMaxWorkers)
    throw std::invalid_argument(fmt::format("workers must be 1..{}", kMaxWorkers));
  if (mtu < kMinTestbedMtu || mtu > kMaxTestbedMtu)
    throw std::invalid_argument(fmt::format("mtu {} is not in {}..{}", mtu, kMinTestbedMtu, kMaxTestbedMtu));
  if (layout.automatic)
    throw std::invalid_argument(
        "aggregators auto: no layout has been chosen yet; plan it from the links first (xagg plan; xagg bench hetero "
        "and xagg testbed up --scenario plan auto themselves)");
  if (!layout.colocated && (layout.aggregators == 0 || layout.aggregators > kMaxAggregators))
    throw std::invalid_argument(fmt::format("aggregators must be 1..{}", kMaxAggregators));
  if (layout.routed && (layout.colocated || layout.aggregators != 1))
    throw std::invalid_argument("a routed layout has one dedicated aggregator");
  // A namespace this testbed would not have (more workers or aggregators, another layout): rebuild
  // from scratch. Fewer workers or aggregators are completed.
  const auto expected = expected_namespaces(workers, layout);
  auto unexpected = [&](const std::string& name) { return std::ranges::find(expected, name) == expected.end(); };
  if (std::ranges::any_of(existing_namespaces(), unexpected)) {
    spdlog::info("testbed {}: rebuilding for {} workers, aggregators {}", prefix_, workers, layout.to_string());
    down();
  }
  layout_ = layout;
  workers_ = workers;
  mtu_ = mtu;
  raise_backlog();
  set_up_bridge(switch_netns(), kBridge);
  if (layout.routed) {
    set_up_bridge(switch_netns(), kSecondBridge);
    set_up_router();
  }
  if (layout.colocated) {
    for (uint32_t i = 0; i < workers; ++i) {
      HostLink uplink = host_uplink(i);
      set_up_bridge(uplink.netns, kHostBridge);
      connect(uplink, kBridge);
      run_command({"ip", "-n", uplink.netns, "link", "set", "dev", uplink.interface, "master", kHostBridge});
      for (const HostLink& host : {worker(i), aggregator(i)}) {
        connect(host, kHostBridge);
        configure_host(host);
      }
      attach_pass_stub(aggregator(i));
    }
  } else {
    for (uint32_t k = 0; k < layout.aggregators; ++k) {
      connect(aggregator(k), kBridge);
      // Aggregators never talk to one another: isolated ports (a switch's
      // private VLAN) keep one aggregator's result broadcasts off the others'
      // links, which would otherwise carry every other shard's results too.
      // A two-level job's root talks to its leaves (and they only to it).
      const bool root = layout.two_level && k + 1 == layout.aggregators;
      run_command({"ip", "netns", "exec", switch_netns(), "bridge", "link", "set", "dev", aggregator(k).bridge_port,
                   "isolated", root ? "off" : "on"});
      configure_host(aggregator(k));
      attach_pass_stub(aggregator(k));
    }
    for (uint32_t i = 0; i < workers; ++i) {
      const HostLink host = worker(i);
      connect(host, host.address.starts_with(kSubnetB) ? kSecondBridge : kBridge);
      configure_host(host);
    }
  }
  spdlog::info("testbed {}: up with {} workers, aggregators {}", prefix_, workers, layout.to_string());
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

void Testbed::set_up_bridge(const std::string& netns, const std::string& bridge) {
  ensure_netns(netns);
  if (!link_exists(netns, bridge)) run_command({"ip", "-n", netns, "link", "add", bridge, "type", "bridge"});
  // Forward at once (no STP listening delay) and flood multicast/broadcast to every port.
  run_command({"ip", "-n", netns, "link", "set", bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0",
               "mcast_snooping", "0"});
  run_command({"ip", "-n", netns, "link", "set", bridge, "mtu", std::to_string(mtu_), "up"});
}

// A veth pair left by an earlier run is reused, without the shaping and loss
// an interrupted run may have left on it.
void Testbed::connect(const HostLink& link, const std::string& bridge) {
  std::string mtu = std::to_string(mtu_);
  ensure_netns(link.netns);
  if (!link_exists(link.bridge_netns, link.bridge_port)) {
    run_command({"ip", "-n", link.bridge_netns, "link", "add", "name", link.bridge_port, "mtu", mtu, "type", "veth",
                 "peer", "name", link.interface, "netns", link.netns, "mtu", mtu});
  } else {
    clear_qdiscs(link.bridge_netns, link.bridge_port);
    clear_qdiscs(link.netns, link.interface);
    try_command({"ip", "-n", link.bridge_netns, "link", "del", ingress_device(link.bridge_port)});
  }
  // "name" and "dev" before the names: `ip link` would read "up" (the uplink) and "a" (the
  // aggregator's port, as "address") as keywords.
  run_command(
      {"ip", "-n", link.bridge_netns, "link", "set", "dev", link.bridge_port, "mtu", mtu, "master", bridge, "up"});
  run_command({"ip", "-n", link.netns, "link", "set", "dev", link.interface, "mtu", mtu, "up"});
  // A wire carries frames. Both ends segment before they transmit (software
  // GSO, where a NIC's TSO would), so that the switch, and the loss filters
  // at its ports, handle a TCP sender's 64 KB send as the 7-44 frames a wire
  // would carry, as they handle each UDP datagram; the sending stack still
  // passes whole GSO packets down. A host (not a co-located host's uplink,
  // a port of its internal switch) coalesces what it receives (GRO, as its
  // NIC would); switch ports do not.
  for (const auto& [netns, device] : {std::pair{link.bridge_netns, link.bridge_port}, {link.netns, link.interface}})
    run_command({"ip", "netns", "exec", netns, "ethtool", "-K", device, "tso", "off", "tx-udp-segmentation", "off"});
  if (!link.address.empty())
    run_command({"ip", "netns", "exec", link.netns, "ethtool", "-K", link.interface, "gro", "on"});
}

void Testbed::configure_host(const HostLink& host) {
  // Results come back as directed broadcasts from XDP: never drop them on
  // reverse-path checks, and let hosts answer broadcast pings for diagnosis.
  sysctl(host.netns, "net.ipv4.conf.all.rp_filter=0");
  sysctl(host.netns, fmt::format("net.ipv4.conf.{}.rp_filter=0", host.interface));
  sysctl(host.netns, "net.ipv4.icmp_echo_ignore_broadcasts=0");
  // `brd +` derives 198.18.255.255 so the directed broadcast is local to every host.
  run_command({"ip", "-n", host.netns, "addr", "replace", fmt::format("{}/{}", host.address, kPrefixLength), "brd",
               "+", "dev", host.interface});
  // Routed: the other subnet through the router.
  if (layout().routed)
    run_command({"ip", "-n", host.netns, "route", "replace", "default", "via",
                 host.address.starts_with(kSubnetB) ? kRouterB : kRouterA, "dev", host.interface});
}

void Testbed::set_up_router() {
  const HostLink legs[] = {{router_netns(), "rta", kRouterA, "eth0", switch_netns()},
                           {router_netns(), "rtb", kRouterB, "eth1", switch_netns()}};
  connect(legs[0], kBridge);
  connect(legs[1], kSecondBridge);
  sysctl(router_netns(), "net.ipv4.ip_forward=1");
  for (const HostLink& leg : legs) {
    sysctl(router_netns(), fmt::format("net.ipv4.conf.{}.rp_filter=0", leg.interface));
    run_command({"ip", "-n", router_netns(), "addr", "replace", fmt::format("{}/{}", leg.address, kPrefixLength),
                 "brd", "+", "dev", leg.interface});
  }
  sysctl(router_netns(), "net.ipv4.conf.all.rp_filter=0");
  route_multicast(legs[0], legs[1]);
}

// The static multicast route "groups kMulticastGroupBase/16 from A to B" as a
// tc program (bpf/xagg_mroute.bpf.c): this kernel has no multicast routing
// (CONFIG_IP_MROUTE) for smcroute or pimd to drive. The netlink attachment
// keeps the program after the skeleton is closed.
void Testbed::route_multicast(const HostLink& from, const HostLink& to) {
  run_in_netns(router_netns(), [&] {
    const int in_ifindex = static_cast<int>(if_nametoindex(from.interface.c_str()));
    const int out_ifindex = static_cast<int>(if_nametoindex(to.interface.c_str()));
    ifreq request{};
    std::strncpy(request.ifr_name, to.interface.c_str(), IFNAMSIZ - 1);
    UniqueFd probe(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (in_ifindex == 0 || out_ifindex == 0 || !probe || ioctl(probe.get(), SIOCGIFHWADDR, &request) != 0)
      throw std::runtime_error(fmt::format("testbed {}: the router's legs {} and {}: {}", prefix_, from.interface,
                                           to.interface, strerror(errno)));
    std::unique_ptr<xagg_mroute_bpf, decltype(&xagg_mroute_bpf__destroy)> skeleton(xagg_mroute_bpf__open(),
                                                                                  &xagg_mroute_bpf__destroy);
    if (!skeleton) throw std::runtime_error(fmt::format("opening the multicast route program: {}", strerror(errno)));
    in_addr prefix{};
    inet_pton(AF_INET, kMulticastGroupBase, &prefix);
    skeleton->rodata->xagg_group_prefix = prefix.s_addr;
    skeleton->rodata->xagg_group_mask = htonl(0xffff0000u);
    skeleton->rodata->xagg_out_ifindex = static_cast<uint32_t>(out_ifindex);
    std::memcpy(const_cast<uint8_t*>(skeleton->rodata->xagg_out_mac), request.ifr_hwaddr.sa_data, ETH_ALEN);
    if (int rc = xagg_mroute_bpf__load(skeleton.get()); rc < 0)
      throw std::runtime_error(fmt::format("loading the multicast route program: {}", strerror(-rc)));
    bpf_tc_hook hook{};
    hook.sz = sizeof(hook);
    hook.ifindex = in_ifindex;
    hook.attach_point = BPF_TC_INGRESS;
    int rc = bpf_tc_hook_create(&hook);
    if (rc < 0 && rc != -EEXIST)
      throw std::runtime_error(fmt::format("adding clsact to the router's {}: {}", from.interface, strerror(-rc)));
    bpf_tc_opts opts{};
    opts.sz = sizeof(opts);
    opts.handle = 1;
    opts.priority = 1;
    opts.prog_fd = bpf_program__fd(skeleton->progs.xagg_forward_multicast);
    opts.flags = BPF_TC_F_REPLACE;
    if (rc = bpf_tc_attach(&hook, &opts); rc < 0)
      throw std::runtime_error(
          fmt::format("attaching the multicast route to the router's {}: {}", from.interface, strerror(-rc)));
  });
}

void Testbed::attach_pass_stub(const HostLink& host) {
  // veth delivers the aggregator's XDP_TX frames only when the peer runs XDP too.
  run_in_netns(host.bridge_netns, [&] {
    unsigned ifindex = if_nametoindex(host.bridge_port.c_str());
    if (ifindex == 0) throw std::runtime_error(fmt::format("no device {} in {}", host.bridge_port, host.bridge_netns));
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

namespace {

// An aggregator killed in the namespace left its maps pinned (dataplane::pin_dir, named by the
// namespace): bpffs outlives the namespace, so they go with it.
// Never stops the teardown: the namespace goes whether or not this worked.
void remove_pins_of(const std::string& netns) {
  try {
    run_in_netns(netns, [] {
      const std::filesystem::path any_interface = dataplane::pin_dir("");
      const std::string prefix = any_interface.filename().string();
      std::error_code ignored;
      for (const auto& entry : std::filesystem::directory_iterator(any_interface.parent_path(), ignored))
        if (entry.path().filename().string().starts_with(prefix)) std::filesystem::remove_all(entry.path(), ignored);
    });
  } catch (const std::exception& error) {
    spdlog::warn("testbed: pins of namespace {} not removed: {}", netns, error.what());
  }
}

}  // namespace

void Testbed::down() {
  // The switch first: deleting it destroys the veth pairs and the XDP stub with them.
  auto names = existing_namespaces();
  std::stable_partition(names.begin(), names.end(), [&](const auto& name) { return name == switch_netns(); });
  for (const auto& name : names) {
    remove_pins_of(name);
    run_command({"ip", "netns", "delete", name});
  }
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

int socket_in(const std::string& netns, int type) {
  int fd = -1;
  run_in_netns(netns, [&] {
    fd = socket(AF_INET, type | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "socket in " + netns);
  });
  return fd;
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
