// Network-namespace testbed: a Linux bridge in its own namespace, one
// aggregator host and N worker hosts, each joined to the bridge by a veth pair.
//
//   <p>-sw   bridge br0, ports "agg", "w0".."w{N-1}" (the veth peers)
//   <p>-agg  eth0 198.18.0.1/16
//   <p>-wI   eth0 198.18.1.(I+1)/16
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "process.h"

namespace xagg::testbed {

inline constexpr const char* kAggregatorAddress = "198.18.0.1";
inline constexpr const char* kBroadcastAddress = "198.18.255.255";
inline constexpr int kPrefixLength = 16;
inline constexpr uint32_t kLinkMtu = 9000;  // XDP programs on veth handle it as xdp.frags
inline constexpr const char* kBridge = "br0";
inline constexpr const char* kHostInterface = "eth0";

// One host attached to the bridge. Per-link shaping (e.g. a bandwidth limit on
// the worker's egress and on its bridge port) belongs here.
struct HostLink {
  std::string netns;        // the host's namespace, holding kHostInterface
  std::string bridge_port;  // the veth peer in the switch namespace
  std::string address;      // IPv4 address without prefix length
};

class Testbed {
 public:
  explicit Testbed(std::string prefix = "xagg");

  // Creates whatever is missing; an existing testbed with another worker count is rebuilt.
  void up(uint32_t workers);
  // Removes every namespace of this prefix, also leftovers of a crashed run.
  void down();

  const std::string& prefix() const { return prefix_; }
  std::string switch_netns() const { return prefix_ + "-sw"; }
  HostLink aggregator() const;
  HostLink worker(uint32_t index) const;
  // Namespaces of this prefix that exist now, sorted.
  std::vector<std::string> existing_namespaces() const;
  // Worker namespaces present now (w0.. contiguous), nullopt when there is no switch.
  std::optional<uint32_t> existing_workers() const;

 private:
  static constexpr uint64_t kMinBacklog = 65536;

  void raise_backlog();
  void set_up_switch();
  void connect(const HostLink& host);
  void attach_pass_stub(const HostLink& host);

  std::string prefix_;
};

// Runs fn on a fresh thread inside the named namespace (setns switches only
// that thread) and rethrows its exception.
void run_in_netns(const std::string& netns, const std::function<void()>& fn);

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
