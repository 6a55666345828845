// Frame builders and the BPF_PROG_TEST_RUN fixture shared by the XDP
// aggregator tests: hand-built Ethernet/IPv4/UDP frames, no network.
#pragma once

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <gtest/gtest.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <unistd.h>

#include <fmt/format.h>

#include <array>
#include <cstring>
#include <optional>

#include "dataplane.h"
#include "wire.h"
#include "xdp_test_run.h"

namespace xagg::dataplane::bpf_test {

using namespace xdp_test;  // Frame, offsets, run_program

constexpr size_t kXaggOffset = kUdpOffset + sizeof(udphdr);
constexpr size_t kPayloadOffset = kXaggOffset + wire::kHeaderBytes;
constexpr size_t kFrameBytes = kPayloadOffset + wire::kChunkElems * 4;  // of a whole chunk

constexpr uint32_t kJobId = 7;
constexpr uint64_t kToken = 0x1122334455667788;
constexpr uint32_t kChunks = 4;
constexpr uint16_t kResultPort = 20000;
constexpr std::array<uint8_t, ETH_ALEN> kAggregatorMac{0x02, 0, 0, 0, 0, 0xaa};
inline const in_addr kAggregatorIp{inet_addr("198.18.0.1")};
inline const in_addr kBroadcastIp{inet_addr("198.18.0.255")};

inline in_addr worker_ip(uint32_t rank) { return in_addr{htonl(ntohl(inet_addr("198.18.0.10")) + rank)}; }
inline std::array<uint8_t, ETH_ALEN> worker_mac(uint32_t rank) { return {0x02, 0, 0, 0, 1, static_cast<uint8_t>(rank)}; }

using Values = std::vector<int32_t>;

// rank's share of a chunk: distinct per rank, iteration and element, with negatives.
inline Values share(uint32_t rank, uint32_t iteration, size_t elements = wire::kChunkElems) {
  Values values(elements);
  for (size_t i = 0; i < values.size(); i++)
    values[i] = static_cast<int32_t>((i * 7 + 1) * (rank + 1) * (iteration + 1)) * (i % 2 ? -1 : 1);
  return values;
}

inline Values sum_of(std::initializer_list<Values> shares) {
  Values sum(shares.begin()->size());
  for (const Values& values : shares)
    for (size_t i = 0; i < sum.size(); i++) sum[i] += values[i];
  return sum;
}

struct FrameSpec {
  wire::Header header;
  Values values;
  in_addr src_ip{};
  uint16_t src_port = kResultPort;
  uint16_t dst_port = wire::kDefaultDataPort;
  std::array<uint8_t, ETH_ALEN> src_mac{};
  // The values' own by default; anything but 1 to kChunkElems whole elements makes a malformed packet.
  std::optional<size_t> payload_bytes;
};

inline Frame build_frame(const FrameSpec& spec) {
  const size_t payload_bytes = spec.payload_bytes.value_or(spec.values.size() * 4);
  Frame frame(kPayloadOffset + payload_bytes);
  write_udp_headers(frame, {spec.src_mac, kAggregatorMac, spec.src_ip, kAggregatorIp, spec.src_port, spec.dst_port});
  wire::encode_header(spec.header, std::as_writable_bytes(std::span(frame).subspan(kXaggOffset)));
  size_t value_bytes = std::min(payload_bytes, spec.values.size() * 4);
  std::memcpy(frame.data() + kPayloadOffset, spec.values.data(), value_bytes);
  return frame;
}

inline iphdr* ip_of(Frame& frame) { return reinterpret_cast<iphdr*>(frame.data() + kIpOffset); }
inline xagg_hdr* xagg_of(Frame& frame) { return reinterpret_cast<xagg_hdr*>(frame.data() + kXaggOffset); }

inline Values payload_of(const Frame& frame) {
  Values values((frame.size() - kPayloadOffset) / 4);
  std::memcpy(values.data(), frame.data() + kPayloadOffset, values.size() * 4);
  return values;
}

inline CounterRow counters_with(std::initializer_list<std::pair<xagg_counter, uint64_t>> nonzero) {
  CounterRow row{};
  for (auto [counter, value] : nonzero) row[counter] = value;
  return row;
}

class AggregatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(geteuid(), 0u) << "bpf_tests loads XDP programs and must run as root (sudo ctest / sudo bpf_tests)";
    dataplane_ = Dataplane::load({});
  }

  void add_job(uint32_t world_size, uint32_t registered_ranks, uint32_t chunk_elements = wire::kChunkElems,
               wire::ResultMode results = wire::ResultMode::Broadcast, in_addr result_ip = kBroadcastIp) {
    JobSpec job{kJobId, kToken, world_size, kChunks, result_ip, kResultPort, {}, chunk_elements, results};
    for (uint32_t rank = 0; rank < registered_ranks; rank++) job.workers.push_back({rank, worker_ip(rank), kResultPort});
    slot_ = dataplane_->add_job(job);
  }
  void add_job(uint32_t world_size) { add_job(world_size, world_size); }

  static FrameSpec data(uint32_t rank, uint32_t chunk, uint32_t iteration, wire::ElemOp op = wire::ElemOp::Sum,
                        size_t elements = wire::kChunkElems) {
    FrameSpec spec;
    spec.header = {wire::MsgType::Data, kJobId, kToken, iteration, chunk, static_cast<uint16_t>(rank), op, 0};
    spec.values = share(rank, iteration, elements);
    spec.src_ip = worker_ip(rank);
    spec.src_mac = worker_mac(rank);
    return spec;
  }

  RunResult run(const FrameSpec& spec) { return run_program(dataplane_->program_fd(), build_frame(spec)); }
  RunResult run(const Frame& frame) { return run_program(dataplane_->program_fd(), frame); }
  void expect_dropped(const FrameSpec& spec) { EXPECT_EQ(run(spec).verdict, XDP_DROP); }
  void expect_dropped(const Frame& frame) { EXPECT_EQ(run(frame).verdict, XDP_DROP); }

  CounterRow job_counters() const { return dataplane_->job_counters(kJobId); }
  CounterRow no_job_counters() const { return dataplane_->no_job_counters(); }

  // The RESULT broadcast for a completed chunk.
  static void expect_broadcast_result(RunResult& result, uint32_t chunk, uint32_t iteration, const Values& expected) {
    ASSERT_EQ(result.verdict, XDP_TX);
    ASSERT_EQ(result.out.size(), kPayloadOffset + expected.size() * 4);
    auto* eth = reinterpret_cast<ethhdr*>(result.out.data());
    EXPECT_EQ(std::vector<uint8_t>(eth->h_dest, eth->h_dest + ETH_ALEN), std::vector<uint8_t>(ETH_ALEN, 0xff));
    EXPECT_EQ(0, std::memcmp(eth->h_source, kAggregatorMac.data(), ETH_ALEN));
    expect_result_header(result, chunk, iteration, kBroadcastIp, kResultPort, 0, expected);
  }

  static void expect_result_header(RunResult& result, uint32_t chunk, uint32_t iteration, in_addr dst_ip,
                                   uint16_t dst_port, uint8_t flags, const Values& expected) {
    iphdr* ip = ip_of(result.out);
    EXPECT_EQ(ip->saddr, kAggregatorIp.s_addr);
    EXPECT_EQ(ip->daddr, dst_ip.s_addr);
    EXPECT_TRUE(ipv4_checksum_valid(result.out));
    auto* udp = reinterpret_cast<udphdr*>(result.out.data() + kUdpOffset);
    EXPECT_EQ(ntohs(udp->source), wire::kDefaultDataPort);
    EXPECT_EQ(ntohs(udp->dest), dst_port);
    EXPECT_EQ(udp->check, 0);
    auto decoded = wire::decode_packet(std::as_bytes(std::span(result.out).subspan(kXaggOffset)));
    ASSERT_TRUE(decoded.header) << wire::to_string(decoded.error);
    EXPECT_EQ(decoded.header->type, wire::MsgType::Result);
    EXPECT_EQ(decoded.header->job_id, kJobId);
    EXPECT_EQ(decoded.header->chunk, chunk);
    EXPECT_EQ(decoded.header->iteration, iteration);
    EXPECT_EQ(decoded.header->flags, flags);
    EXPECT_EQ(payload_of(result.out), expected);
  }

  std::unique_ptr<Dataplane> dataplane_;
  uint32_t slot_ = 0;
};

}  // namespace xagg::dataplane::bpf_test
