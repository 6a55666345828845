// Socket helpers shared by the daemon, the worker library and the baselines:
// address formatting, polling with a deadline and a TCP connect that outlasts
// a lossy network.
#pragma once

#include <netinet/in.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "unique_fd.h"

namespace xagg {

// "a.b.c.d" and "a.b.c.d:port" for messages.
std::string to_string(in_addr address);
std::string to_string(const sockaddr_in& address);

// The first IPv4 address of an interface of the caller's network namespace.
struct InterfaceAddress {
  in_addr address{};
  in_addr broadcast{};  // directed broadcast of the interface's subnet
  in_addr netmask{};    // of that subnet
  // Whether `peer` is on the interface's subnet (one segment: broadcasts reach it).
  bool on_subnet(in_addr peer) const { return ((peer.s_addr ^ address.s_addr) & netmask.s_addr) == 0; }
};
// nullopt when ifname has no IPv4 address (or does not exist); throws
// std::runtime_error when the addresses cannot be listed.
std::optional<InterfaceAddress> ipv4_of(const std::string& ifname);

// "IPv4" or "IPv4:port" (a control endpoint; default_port where absent);
// nullopt when the text is neither.
std::optional<sockaddr_in> parse_endpoint(const std::string& text, uint16_t default_port);

// The hardware address of an interface of the caller's network namespace.
std::optional<std::array<uint8_t, 6>> mac_of(const std::string& ifname);

// The first hop towards `destination` by the main routing table: the
// gateway, or the destination itself when on-link. Throws std::runtime_error
// when there is no route.
struct NextHop {
  std::string interface;
  in_addr address{};
};
NextHop next_hop_towards(in_addr destination);

// The hardware address of a next hop from the neighbour (ARP) table; nullopt
// while it is not resolved.
std::optional<std::array<uint8_t, 6>> neighbour_mac(const NextHop& hop);

// The MTU of an interface of the caller's network namespace; nullopt when it does not exist.
std::optional<uint32_t> mtu_of(const std::string& ifname);

// The MTU of the path to `destination` as the kernel knows it (the route's or
// its interface's, lowered by any ICMP "fragmentation needed" seen). Throws
// CommError when there is no route.
uint32_t path_mtu(in_addr destination);

// Polls fd until one of `events` or the deadline: revents, 0 at the deadline.
// Throws CommError if poll itself fails.
short poll_until(int fd, short events, std::chrono::steady_clock::time_point deadline);

// A non-blocking TCP socket connected to peer before the deadline; errors
// name the peer as "<peer_name> a.b.c.d:port" (e.g. "the aggregator").
// `prepare` runs on each new socket before connect (buffer sizes, options).
// Unreachable attempts are retried with a fresh socket until the deadline: on
// a lossy link every ARP probe for the peer can be lost, which fails connect
// with "No route to host" although the next try may well get through. A
// refused connection throws CommError at once (nobody listens there), as do
// other errors; TimeoutError (naming the last error) at the deadline.
UniqueFd connect_before(std::string_view peer_name, const sockaddr_in& peer,
                        std::chrono::steady_clock::time_point deadline,
                        const std::function<void(int fd)>& prepare = {});

}  // namespace xagg
