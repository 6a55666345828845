// What every XDP program test needs: hand-built frames, their IPv4 header
// check, and one BPF_PROG_TEST_RUN of a program over a frame (no network).
#pragma once

#include <bpf/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace xagg::xdp_test {

using Frame = std::vector<uint8_t>;

constexpr size_t kIpOffset = sizeof(ethhdr);
constexpr size_t kUdpOffset = kIpOffset + sizeof(iphdr);

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
