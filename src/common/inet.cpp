#include "inet.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if_arp.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "xagg/errors.h"

namespace xagg {
namespace {

using Clock = std::chrono::steady_clock;

// A lost ARP exchange fails connect with EHOSTUNREACH, lost SYNs with
// ETIMEDOUT; "no route" (ENETUNREACH) is a configuration error and fails at once.
bool is_unreachable(int error) { return error == EHOSTUNREACH || error == ETIMEDOUT; }

// 0 once the connect completes, the socket's error otherwise; ETIMEDOUT at the deadline.
int finish_connect(int fd, Clock::time_point deadline) {
  if (poll_until(fd, POLLOUT, deadline) == 0) return ETIMEDOUT;
  int error = 0;
  socklen_t length = sizeof(error);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) return errno;
  return error;
}

}  // namespace

std::string to_string(in_addr address) {
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &address, text, sizeof(text));
  return text;
}

std::string to_string(const sockaddr_in& address) {
  return fmt::format("{}:{}", to_string(address.sin_addr), ntohs(address.sin_port));
}

std::optional<InterfaceAddress> ipv4_of(const std::string& ifname) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    throw std::runtime_error(fmt::format("listing interface addresses: {}", std::strerror(errno)));
  std::optional<InterfaceAddress> found;
  for (ifaddrs* entry = list; entry && !found; entry = entry->ifa_next) {
    if (!entry->ifa_addr || entry->ifa_addr->sa_family != AF_INET || ifname != entry->ifa_name) continue;
    in_addr address = reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr;
    in_addr mask = reinterpret_cast<sockaddr_in*>(entry->ifa_netmask)->sin_addr;
    found = InterfaceAddress{address, in_addr{address.s_addr | ~mask.s_addr}, mask};
  }
  freeifaddrs(list);
  return found;
}

std::optional<uint32_t> mtu_of(const std::string& ifname) {
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  ifreq request{};
  if (!fd || ifname.size() >= sizeof(request.ifr_name)) return std::nullopt;
  std::memcpy(request.ifr_name, ifname.c_str(), ifname.size());
  if (::ioctl(fd.get(), SIOCGIFMTU, &request) != 0) return std::nullopt;
  return static_cast<uint32_t>(request.ifr_mtu);
}

uint32_t path_mtu(in_addr destination) {
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) throw CommError(fmt::format("socket: {}", std::strerror(errno)));
  // Connecting a UDP socket sends nothing; it looks up the route. Any port does.
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_addr = destination;
  peer.sin_port = htons(9);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&peer), sizeof(peer)) != 0)
    throw CommError(fmt::format("no route to {}: {}", to_string(destination), std::strerror(errno)));
  int mtu = 0;
  socklen_t length = sizeof(mtu);
  if (::getsockopt(fd.get(), IPPROTO_IP, IP_MTU, &mtu, &length) != 0 || mtu <= 0)
    throw CommError(fmt::format("path MTU to {}: {}", to_string(destination), std::strerror(errno)));
  return static_cast<uint32_t>(mtu);
}

short poll_until(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd entry{fd, events, 0};
    int ready = ::poll(&entry, 1, static_cast<int>(std::clamp<long long>(left, 0, 1'000'000)));
    if (ready > 0) return entry.revents;
    if (ready == 0 && Clock::now() >= deadline) return 0;
    if (ready < 0 && errno != EINTR) throw CommError(fmt::format("poll: {}", std::strerror(errno)));
  }
}

UniqueFd connect_before(std::string_view peer_name, const sockaddr_in& peer, Clock::time_point deadline,
                        const std::function<void(int fd)>& prepare) {
  constexpr auto kRetryPause = std::chrono::milliseconds(100);
  for (;;) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) throw CommError(fmt::format("socket for {} {}: {}", peer_name, to_string(peer), std::strerror(errno)));
    if (prepare) prepare(fd.get());
    int error = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&peer), sizeof(peer)) == 0 ? 0 : errno;
    if (error == EINPROGRESS) error = finish_connect(fd.get(), deadline);
    if (error == 0) return fd;
    if (!is_unreachable(error))
      throw CommError(fmt::format("connect to {} {}: {}", peer_name, to_string(peer), std::strerror(error)));
    auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero())
      throw TimeoutError(fmt::format("connect to {} {}: timed out (last attempt: {})", peer_name, to_string(peer),
                                     std::strerror(error)));
    std::this_thread::sleep_for(std::min<Clock::duration>(kRetryPause, left));
  }
}

std::optional<sockaddr_in> parse_endpoint(const std::string& text, uint16_t default_port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(default_port);
  std::string host = text;
  if (size_t colon = text.find(':'); colon != std::string::npos) {
    host = text.substr(0, colon);
    std::string port = text.substr(colon + 1);
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return {};
    unsigned long value = std::stoul(port);
    if (value == 0 || value > UINT16_MAX) return {};
    address.sin_port = htons(static_cast<uint16_t>(value));
  }
  if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) return {};
  return address;
}

std::optional<std::array<uint8_t, 6>> mac_of(const std::string& ifname) {
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  ifreq request{};
  if (!fd || ifname.size() >= sizeof(request.ifr_name)) return std::nullopt;
  ifname.copy(request.ifr_name, ifname.size());
  if (::ioctl(fd.get(), SIOCGIFHWADDR, &request) != 0) return std::nullopt;
  std::array<uint8_t, 6> mac{};
  std::copy_n(reinterpret_cast<const uint8_t*>(request.ifr_hwaddr.sa_data), mac.size(), mac.begin());
  return mac;
}

NextHop next_hop_towards(in_addr destination) {
  std::ifstream routes("/proc/net/route");
  if (!routes) throw std::runtime_error("cannot read /proc/net/route");
  std::string line;
  std::getline(routes, line);  // the column names
  std::optional<NextHop> best;
  uint32_t best_mask = 0, best_metric = 0;
  while (std::getline(routes, line)) {
    std::istringstream fields(line);
    std::string ifname;
    uint32_t network = 0, gateway = 0, flags = 0, refcnt = 0, use = 0, metric = 0, mask = 0;
    if (!(fields >> ifname >> std::hex >> network >> gateway >> flags >> std::dec >> refcnt >> use >> metric >> std::hex >>
          mask))
      continue;
    // Fields are in network order, printed as host-order hex: compare them as read.
    constexpr uint32_t kRouteUp = 1;
    if (!(flags & kRouteUp) || (destination.s_addr & mask) != network) continue;
    const uint32_t prefix = std::popcount(mask);
    if (best && (prefix < best_mask || (prefix == best_mask && metric >= best_metric))) continue;
    best = NextHop{ifname, gateway != 0 ? in_addr{gateway} : destination};
    best_mask = prefix;
    best_metric = metric;
  }
  if (!best) throw std::runtime_error(fmt::format("no route to {}", to_string(destination)));
  return *best;
}

std::optional<std::array<uint8_t, 6>> neighbour_mac(const NextHop& hop) {
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  arpreq request{};
  if (!fd || hop.interface.size() >= sizeof(request.arp_dev)) return std::nullopt;
  auto* address = reinterpret_cast<sockaddr_in*>(&request.arp_pa);
  address->sin_family = AF_INET;
  address->sin_addr = hop.address;
  hop.interface.copy(request.arp_dev, hop.interface.size());
  if (::ioctl(fd.get(), SIOCGARP, &request) != 0 || !(request.arp_flags & ATF_COM)) return std::nullopt;
  std::array<uint8_t, 6> mac{};
  std::copy_n(reinterpret_cast<const uint8_t*>(request.arp_ha.sa_data), mac.size(), mac.begin());
  return mac;
}

}  // namespace xagg
