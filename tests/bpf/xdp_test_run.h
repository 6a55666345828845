// What every XDP program test needs: hand-built frames, their IPv4 header
// check, and one BPF_PROG_TEST_RUN of a program over a frame (no network).
#pragma once

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace xagg::xdp_test {

using Frame = std::vector<uint8_t>;

constexpr size_t kIpOffset = sizeof(ethhdr);
constexpr size_t kUdpOffset = kIpOffset + sizeof(iphdr);

// Who sends a frame to whom.
struct UdpEndpoints {
  std::array<uint8_t, ETH_ALEN> src_mac{}, dst_mac{};
  in_addr src_ip{}, dst_ip{};
  uint16_t src_port = 0, dst_port = 0;
};

// Writes the Ethernet, IPv4 (no options, checksum left 0) and UDP headers of
// a frame of frame.size() bytes.
inline void write_udp_headers(Frame& frame, const UdpEndpoints& endpoints) {
  auto* eth = reinterpret_cast<ethhdr*>(frame.data());
  std::memcpy(eth->h_dest, endpoints.dst_mac.data(), ETH_ALEN);
  std::memcpy(eth->h_source, endpoints.src_mac.data(), ETH_ALEN);
  eth->h_proto = htons(ETH_P_IP);
  auto* ip = reinterpret_cast<iphdr*>(frame.data() + kIpOffset);
  ip->version = 4;
  ip->ihl = 5;
  ip->tot_len = htons(static_cast<uint16_t>(frame.size() - kIpOffset));
  ip->ttl = 64;
  ip->protocol = IPPROTO_UDP;
  ip->saddr = endpoints.src_ip.s_addr;
  ip->daddr = endpoints.dst_ip.s_addr;
  auto* udp = reinterpret_cast<udphdr*>(frame.data() + kUdpOffset);
  udp->source = htons(endpoints.src_port);
  udp->dest = htons(endpoints.dst_port);
  udp->len = htons(static_cast<uint16_t>(frame.size() - kUdpOffset));
}

inline bool ipv4_checksum_valid(const Frame& frame) {
  uint32_t sum = 0;
  for (size_t i = 0; i < sizeof(iphdr); i += 2)
    sum += static_cast<uint32_t>(frame[kIpOffset + i] << 8 | frame[kIpOffset + i + 1]);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return sum == 0xffff;
}

struct RunResult {
  uint32_t verdict = 0;
  Frame out;
};

inline RunResult run_program(int prog_fd, const Frame& in, int repeat = 1) {
  RunResult result;
  result.out.resize(in.size() + 256);
  LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = in.data(), .data_out = result.out.data(),
              .data_size_in = static_cast<uint32_t>(in.size()),
              .data_size_out = static_cast<uint32_t>(result.out.size()), .repeat = repeat);
  int rc = bpf_prog_test_run_opts(prog_fd, &opts);
  if (rc != 0) throw std::runtime_error(fmt::format("BPF_PROG_TEST_RUN: {}", std::strerror(-rc)));
  result.verdict = opts.retval;
  result.out.resize(opts.data_size_out);
  return result;
}

}  // namespace xagg::xdp_test
