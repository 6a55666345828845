#include "link_stats.h"

#include <fmt/format.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "unique_fd.h"

namespace xagg::dataplane {
namespace {

[[noreturn]] void fail(const std::string& interface, const std::string& what, int error) {
  throw std::runtime_error(fmt::format("interface {}: {}: {}", interface, what, std::strerror(error)));
}

// Those that tell where received frames went before XDP, and the totals to compare them with.
LinkCounters named(const rtnl_link_stats64& stats) {
  return {
      {"rx_packets", stats.rx_packets},
      {"rx_bytes", stats.rx_bytes},
      {"rx_errors", stats.rx_errors},
      {"rx_dropped", stats.rx_dropped},
      {"rx_missed_errors", stats.rx_missed_errors},
      {"rx_fifo_errors", stats.rx_fifo_errors},
      {"rx_over_errors", stats.rx_over_errors},
      {"rx_length_errors", stats.rx_length_errors},
      {"rx_crc_errors", stats.rx_crc_errors},
      {"rx_frame_errors", stats.rx_frame_errors},
      {"rx_nohandler", stats.rx_nohandler},
      {"tx_packets", stats.tx_packets},
      {"tx_bytes", stats.tx_bytes},
      {"tx_errors", stats.tx_errors},
      {"tx_dropped", stats.tx_dropped},
      {"tx_fifo_errors", stats.tx_fifo_errors},
      {"tx_carrier_errors", stats.tx_carrier_errors},
  };
}

}  // namespace

LinkCounters read_link_counters(const std::string& interface) {
  const unsigned index = if_nametoindex(interface.c_str());
  if (index == 0) fail(interface, "no such interface in this network namespace", errno);
  UniqueFd socket_fd(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
  if (!socket_fd) fail(interface, "opening an rtnetlink socket", errno);

  struct {
    nlmsghdr header;
    ifinfomsg link;
  } request{};
  request.header.nlmsg_len = sizeof(request);
  request.header.nlmsg_type = RTM_GETLINK;
  request.header.nlmsg_flags = NLM_F_REQUEST;
  request.header.nlmsg_seq = 1;
  request.link.ifi_family = AF_UNSPEC;
  request.link.ifi_index = static_cast<int>(index);
  if (send(socket_fd.get(), &request, sizeof(request), 0) < 0) fail(interface, "asking rtnetlink", errno);

  // One RTM_NEWLINK (a few KB with every attribute) or an error.
  alignas(nlmsghdr) char buffer[65536];
  const ssize_t received = recv(socket_fd.get(), buffer, sizeof(buffer), 0);
  if (received < 0) fail(interface, "reading rtnetlink's answer", errno);
  auto* header = reinterpret_cast<nlmsghdr*>(buffer);
  if (!NLMSG_OK(header, static_cast<unsigned>(received))) fail(interface, "short rtnetlink answer", EPROTO);
  if (header->nlmsg_type == NLMSG_ERROR)
    fail(interface, "RTM_GETLINK", -static_cast<nlmsgerr*>(NLMSG_DATA(header))->error);
  if (header->nlmsg_type != RTM_NEWLINK) fail(interface, "unexpected rtnetlink answer", EPROTO);
  auto* link = static_cast<ifinfomsg*>(NLMSG_DATA(header));
  int length = static_cast<int>(IFLA_PAYLOAD(header));
  for (auto* attribute = IFLA_RTA(link); RTA_OK(attribute, length); attribute = RTA_NEXT(attribute, length)) {
    if (attribute->rta_type != IFLA_STATS64) continue;
    rtnl_link_stats64 stats{};  // an older kernel's shorter struct leaves the rest 0
    std::memcpy(&stats, RTA_DATA(attribute), std::min<size_t>(RTA_PAYLOAD(attribute), sizeof(stats)));
    return named(stats);
  }
  fail(interface, "rtnetlink gave no IFLA_STATS64", ENODATA);
}

}  // namespace xagg::dataplane
