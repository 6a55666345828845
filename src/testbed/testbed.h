// Network-namespace testbed: a Linux bridge in its own namespace (the
// switch), aggregator hosts and N worker hosts, each joined to it by a veth
// pair, in one of three layouts (Layout):
//
// Single (the default) and dedicated K: K aggregator hosts of their own.
//   <p>-sw       bridge br0, ports "agg", "agg1".."agg{K-1}", "w0".."w{N-1}" (the veth peers)
//   <p>-agg      eth0 198.18.0.1/16      (aggregator 0)
//   <p>-agg{k}   eth0 198.18.0.(k+1)/16  (aggregator k > 0)
//   <p>-wI       eth0 198.18.1.(I+1)/16
//
// Co-located: one aggregator on every worker host. Each host is modelled as a
// host with an internal switch (like an SR-IOV NIC's embedded switch, which
// switches VF-to-VF traffic locally): its one link to the switch carries ALL
// its traffic, worker and aggregator alike, while a worker's traffic to its
// own host's aggregator never crosses that link.
//   <p>-sw       bridge br0, ports "w0".."w{N-1}" (peers of the hosts' uplinks)
//   <p>-hI       bridge hbr, ports "up" (the uplink), "w" and "a"
//   <p>-wI       eth0 198.18.1.(I+1)/16  (peer: port "w" of <p>-hI)
//   <p>-aI       eth0 198.18.2.(I+1)/16  (peer: port "a" of <p>-hI; aggregator I)
//
// Routed: one aggregator and the workers on two subnets, each a bridge of
// the switch namespace, joined by a router (IP forwarding, and a static
// multicast route for the testbed's groups from subnet A to subnet B).
//   <p>-sw       bridges br0 (subnet A: ports "agg", "rta", even workers) and br1 (subnet B: "rtb", odd workers)
//   <p>-rt       eth0 198.18.0.254/16 (peer "rta" on br0), eth1 198.19.0.254/16 (peer "rtb" on br1)
//   <p>-agg      eth0 198.18.0.1/16
//   <p>-wI       eth0 198.18.1.(I+1)/16 for even I, 198.19.1.(I+1)/16 for odd I; default route via the router
//
// Otherwise all hosts share one L2 segment, 198.18.0.0/16. Every link has one MTU (9000 unless told).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "process.h"

namespace xagg::testbed {

inline constexpr const char* kAggregatorAddress = "198.18.0.1";  // aggregator 0 of a single or dedicated layout
inline constexpr const char* kBroadcastAddress = "198.18.255.255";
inline constexpr int kPrefixLength = 16;
inline constexpr uint32_t kLinkMtu = 9000;  // the default; XDP programs on veth handle it as xdp.frags
inline constexpr uint32_t kMinTestbedMtu = 1280;
inline constexpr uint32_t kMaxTestbedMtu = 9000;
inline constexpr const char* kBridge = "br0";
inline constexpr const char* kHostBridge = "hbr";  // a co-located host's internal switch
inline constexpr const char* kHostInterface = "eth0";
inline constexpr const char* kUplinkInterface = "up";  // a co-located host's link to the switch
inline constexpr const char* kSecondBridge = "br1";     // a routed layout's subnet B
// A testbed's multicast groups: what `--results multicast` aggregators get as --multicast-group.
inline constexpr const char* kMulticastGroupBase = "239.18.0.0";
// Worker addresses are 198.18.1.1 and up; past 64 (one aggregator's rank
// bitmap) only two-level jobs use them all.
inline constexpr uint32_t kMaxWorkers = 250;
inline constexpr uint32_t kMaxAggregators = 64;

// Where the aggregators run.
struct Layout {
  uint32_t aggregators = 1;  // dedicated aggregator hosts; ignored when colocated
  bool colocated = false;    // one aggregator on every worker host
  bool routed = false;       // one aggregator, the workers on two subnets behind a router
  // Two-level jobs: aggregators - 1 leaves and the last aggregator as their
  // root, the one aggregator port not isolated from the others.
  bool two_level = false;
  // "auto": the planner (src/plan) chooses among the layouts from the link
  // rates; until then `aggregators` counts the hosts free to be dedicated
  // aggregators (0..64). No testbed comes up in it.
  bool automatic = false;

  // "1".."64", "colocated", "routed", "two-level:L" (L = 1..63 leaves plus a
  // root) or "auto"; throws std::invalid_argument naming the problem.
  static Layout parse(const std::string& text);
  std::string to_string() const;  // "1", "4", "colocated", "routed", "two-level:3", "auto"
  // Two levels: the ranks per leaf that fill every leaf (the last may have
  // fewer); throws std::invalid_argument when `workers` cannot; 0 for one level.
  uint32_t ranks_per_leaf(uint32_t workers) const;
  bool operator==(const Layout& other) const {
    return colocated == other.colocated && routed == other.routed && two_level == other.two_level &&
           automatic == other.automatic && (colocated || aggregators == other.aggregators);
  }
};

// A host's link to a bridge: a veth pair from `interface` in `netns` to its
// peer `bridge_port`, a port of the bridge in `bridge_netns`. Per-link shaping
// and loss go on these two devices.
struct HostLink {
  std::string netns;        // the host's namespace, holding `interface`
  std::string bridge_port;  // the veth peer, a port of the bridge in bridge_netns
  std::string address;      // IPv4 address without prefix length; empty for a co-located host's uplink
  std::string interface = kHostInterface;
  std::string bridge_netns;  // the switch's namespace, or a co-located host's
};

// A host of the testbed as scenario files and the command line name it:
// "worker I" or "aggregator K". Its link is the one its traffic leaves by
// (Testbed::link_of).
struct HostRef {
  enum class Role { Worker, Aggregator };
  Role role = Role::Worker;
  uint32_t index = 0;

  // Throws std::invalid_argument naming the text and the expected form.
  static HostRef parse(const std::string& text);
  std::string to_string() const;  // "worker 1"
  bool operator==(const HostRef& other) const = default;
};

// "<base><pid>": the default prefix of the commands that build a testbed for
// one run and remove it (demo, bench, train), so that two runs on one host
// never share (and tear down) each other's namespaces.
std::string per_run_prefix(std::string_view base);

class Testbed {
 public:
  explicit Testbed(std::string prefix = "xagg");

  // Creates whatever is missing; an existing testbed with another worker count
  // or layout is rebuilt. Workers: 1..64; mtu: every link's, kMinTestbedMtu..kMaxTestbedMtu.
  void up(uint32_t workers, Layout layout = {}, uint32_t mtu = kLinkMtu);
  // Removes every namespace of this prefix in any layout, also leftovers of a crashed run.
  void down();

  const std::string& prefix() const { return prefix_; }
  std::string switch_netns() const { return prefix_ + "-sw"; }
  std::string router_netns() const { return prefix_ + "-rt"; }
  // The layout of the last up(), else the one detected from the existing namespaces.
  Layout layout() const;
  // K, or the number of workers when co-located.
  uint32_t aggregator_count() const;
  // Aggregator `index` (0..aggregator_count()-1); for co-located, the one on worker host `index`,
  // whose bridge port is on the host's internal switch (its link is host_uplink(index)).
  HostLink aggregator(uint32_t index = 0) const;
  std::vector<std::string> aggregator_addresses() const;  // in index order
  // Worker `index`; when co-located its bridge port is on the host's internal switch.
  HostLink worker(uint32_t index) const;
  // Co-located only: host `index`'s uplink, interface "up" in <p>-h{index}, bridge port "w{index}" on br0.
  HostLink host_uplink(uint32_t index) const;
  // The link between worker `index`'s host and the switch: worker(index), or host_uplink(index) when
  // co-located. A worker's link rate and loss apply to it.
  HostLink worker_link(uint32_t index) const;
  // worker(index) or aggregator(index).
  HostLink host(HostRef ref) const;
  // The link between a host and the switch: worker_link for a worker; a dedicated
  // aggregator's own link, or a co-located aggregator's host uplink.
  HostLink link_of(HostRef ref) const;
  // Namespaces of this prefix that exist now, sorted.
  std::vector<std::string> existing_namespaces() const;
  // Worker namespaces present now (w0.. contiguous), nullopt when there is no switch.
  std::optional<uint32_t> existing_workers() const;
  // Layout of the namespaces present now, nullopt when there is no switch.
  std::optional<Layout> existing_layout() const;

 private:
  static constexpr uint64_t kMinBacklog = 65536;

  std::string indexed_netns(const char* role, uint32_t index) const;  // <p>-<role><index>
  HostLink dedicated_aggregator(uint32_t index) const;
  std::vector<std::string> expected_namespaces(uint32_t workers, const Layout& layout) const;
  void raise_backlog();
  void set_up_bridge(const std::string& netns, const std::string& bridge);
  // Joins link.interface to `bridge` (in link.bridge_netns) through a veth pair.
  void connect(const HostLink& link, const std::string& bridge);
  // Address and sysctls of a host's eth0.
  void configure_host(const HostLink& host);
  void attach_pass_stub(const HostLink& host);
  // Routed layout: the router's two legs, forwarding, and the multicast route.
  void set_up_router();
  void route_multicast(const HostLink& from, const HostLink& to);

  std::string prefix_;
  std::optional<Layout> layout_;  // of the last up()
  uint32_t workers_ = 0;          // of the last up()
  uint32_t mtu_ = kLinkMtu;       // of the last up()
};

// Runs fn on a fresh thread inside the named namespace (setns switches only
// that thread) and rethrows its exception.
void run_in_netns(const std::string& netns, const std::function<void()>& fn);

// A socket (AF_INET, `type`) of the named namespace: a socket keeps the
// namespace it was made in, so it can be used from any thread afterwards.
// The caller owns the descriptor.
int socket_in(const std::string& netns, int type);

// True once a TCP connect to address:port from inside netns succeeds.
bool tcp_port_open(const std::string& netns, const std::string& address, uint16_t port);

// Polls until the TCP port accepts; throws when the server process exits or the deadline passes.
void wait_for_tcp_port(const std::string& netns, const std::string& address, uint16_t port,
                       Process& server, Clock::time_point deadline);

// Calls down() when the scope ends, also when it ends by an exception.
class TeardownGuard {
 public:
  explicit TeardownGuard(Testbed& testbed) : testbed_(testbed) {}
  ~TeardownGuard();
  TeardownGuard(const TeardownGuard&) = delete;
  TeardownGuard& operator=(const TeardownGuard&) = delete;

 private:
  Testbed& testbed_;
};

}  // namespace xagg::testbed
