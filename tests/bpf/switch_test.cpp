// Runs the switch-style baseline's XDP program (bpf/xagg_switch.bpf.c) on
// hand-built frames with BPF_PROG_TEST_RUN, loaded by the daemon's own loader,
// at SwitchML's 256 elements per packet, at XAgg's 2048 (a jumbo frame whose
// payload continues into fragments) and at a size that is no whole number of
// the program's merge blocks. Every element of every result is checked.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <gtest/gtest.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <pthread.h>
#include <unistd.h>

#include <fmt/format.h>

#include <array>
#include <barrier>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "baselines/switch/switch_dataplane.h"
#include "xdp_test_run.h"

namespace xagg::baselines::switchml {
namespace {

using Values = std::vector<int32_t>;
using namespace xdp_test;  // Frame, offsets, run_program

constexpr size_t kHeaderOffset = kUdpOffset + sizeof(udphdr);
constexpr size_t kPayloadOffset = kHeaderOffset + XSW_HDR_BYTES;

constexpr uint16_t kDataPort = 9989;
constexpr uint16_t kResultPort = 20100;
constexpr uint32_t kJobId = 3;
constexpr uint64_t kToken = 0x0102030405060708;
constexpr uint32_t kPoolSlots = 8;
constexpr std::array<uint8_t, ETH_ALEN> kAggregatorMac{0x02, 0, 0, 0, 0, 0xaa};
const in_addr kAggregatorIp{inet_addr("198.18.0.1")};
const in_addr kBroadcastIp{inet_addr("198.18.255.255")};

in_addr worker_ip(uint32_t rank) { return in_addr{htonl(ntohl(inet_addr("198.18.1.1")) + rank)}; }
std::array<uint8_t, ETH_ALEN> worker_mac(uint32_t rank) { return {0x02, 0, 0, 0, 1, static_cast<uint8_t>(rank)}; }

// rank's share of a block: distinct per rank, block and element, with negatives.
Values share(uint32_t rank, uint32_t block, size_t elements) {
  Values values(elements);
  for (size_t i = 0; i < elements; ++i)
    values[i] = static_cast<int32_t>((i * 7 + 1) * (rank + 1) * (block + 1)) * (i % 2 ? -1 : 1);
  return values;
}

struct Packet {
  uint32_t rank = 0;
  uint32_t slot = 0;
  uint8_t ver = 0;
  uint32_t block = 0;
  uint8_t op = XSW_OP_SUM;
  Values values;
};

Frame build_frame(const Packet& packet) {
  Frame frame(kPayloadOffset + packet.values.size() * 4);
  write_udp_headers(frame, {worker_mac(packet.rank), kAggregatorMac, worker_ip(packet.rank), kAggregatorIp,
                            kResultPort, kDataPort});
  xsw_hdr header{};
  header.magic = htons(XSW_MAGIC);
  header.type = XSW_MSG_DATA;
  header.op = packet.op;
  header.job_id = htonl(kJobId);
  header.token = htobe64(kToken);
  header.rank = htons(static_cast<uint16_t>(packet.rank));
  header.slot = htons(static_cast<uint16_t>(packet.slot));
  header.ver = packet.ver;
  header.block = htonl(packet.block);
  std::memcpy(frame.data() + kHeaderOffset, &header, sizeof(header));
  std::memcpy(frame.data() + kPayloadOffset, packet.values.data(), packet.values.size() * 4);
  return frame;
}

Values payload_of(const Frame& frame) {
  Values values((frame.size() - kPayloadOffset) / 4);
  std::memcpy(values.data(), frame.data() + kPayloadOffset, values.size() * 4);
  return values;
}

void pin_to_cpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(set), &set), 0);
}

using Counters = std::vector<uint64_t>;

Counters counters_with(std::initializer_list<std::pair<xsw_counter, uint64_t>> nonzero) {
  Counters counters(XSW_CNT_COUNT);
  for (auto [counter, value] : nonzero) counters[counter] = value;
  return counters;
}

// Parameter: elements per packet.
class SwitchProgramTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  void SetUp() override {
    ASSERT_EQ(geteuid(), 0u) << "switch_bpf_tests loads XDP programs and must run as root";
    dataplane_ = std::make_unique<SwitchDataplane>(kDataPort, kPoolSlots);
  }

  void start_job(uint32_t world_size, uint32_t slots = kPoolSlots) {
    xsw_config config{};
    config.job_id = kJobId;
    config.world_size = world_size;
    config.slots = slots;
    config.bcast_ip = kBroadcastIp.s_addr;
    config.token = kToken;
    config.result_port = htons(kResultPort);
    std::map<uint32_t, xsw_worker> workers;
    for (uint32_t rank = 0; rank < world_size; ++rank) workers[rank] = {worker_ip(rank).s_addr, htons(kResultPort), 1};
    dataplane_->start_job(config, workers);
  }

  static uint32_t elements() { return GetParam(); }

  // rank's share of `block`, sent into slot block % kPoolSlots in its use `ver`.
  static Packet data(uint32_t rank, uint32_t block, uint8_t ver = 0, uint8_t op = XSW_OP_SUM) {
    return {rank, block % kPoolSlots, ver, block, op, share(rank, block, elements())};
  }

  RunResult run(const Packet& packet) { return run_program(dataplane_->program_fd(), build_frame(packet)); }
  RunResult run(const Frame& frame) { return run_program(dataplane_->program_fd(), frame); }
  void expect_dropped(const Packet& packet) { EXPECT_EQ(run(packet).verdict, XDP_DROP); }

  static Values sum_of(uint32_t ranks, uint32_t block) {
    Values sum(elements());
    for (uint32_t rank = 0; rank < ranks; ++rank) {
      Values values = share(rank, block, elements());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += values[i];
    }
    return sum;
  }

  // A RESULT to dst_ip:dst_port carrying `expected` for the slot use of `sent`.
  static void expect_result(const RunResult& result, const Packet& sent, in_addr dst_ip, uint16_t dst_port,
                            uint8_t flags, const Values& expected) {
    ASSERT_EQ(result.verdict, XDP_TX);
    ASSERT_EQ(result.out.size(), kPayloadOffset + expected.size() * 4);
    const auto* eth = reinterpret_cast<const ethhdr*>(result.out.data());
    EXPECT_EQ(0, std::memcmp(eth->h_source, kAggregatorMac.data(), ETH_ALEN));
    const auto* ip = reinterpret_cast<const iphdr*>(result.out.data() + kIpOffset);
    EXPECT_EQ(ip->saddr, kAggregatorIp.s_addr);
    EXPECT_EQ(ip->daddr, dst_ip.s_addr);
    EXPECT_TRUE(ipv4_checksum_valid(result.out));
    const auto* udp = reinterpret_cast<const udphdr*>(result.out.data() + kUdpOffset);
    EXPECT_EQ(ntohs(udp->source), kDataPort);
    EXPECT_EQ(ntohs(udp->dest), dst_port);
    EXPECT_EQ(udp->check, 0);
    xsw_hdr header;
    std::memcpy(&header, result.out.data() + kHeaderOffset, sizeof(header));
    EXPECT_EQ(header.type, XSW_MSG_RESULT);
    EXPECT_EQ(header.flags, flags);
    EXPECT_EQ(ntohs(header.slot), sent.slot);
    EXPECT_EQ(header.ver, sent.ver);
    EXPECT_EQ(ntohl(header.block), sent.block);
    EXPECT_EQ(payload_of(result.out), expected);
  }

  static void expect_broadcast(const RunResult& result, const Packet& sent, const Values& expected) {
    const auto* eth = reinterpret_cast<const ethhdr*>(result.out.data());
    EXPECT_EQ(std::vector<uint8_t>(eth->h_dest, eth->h_dest + ETH_ALEN), std::vector<uint8_t>(ETH_ALEN, 0xff));
    expect_result(result, sent, kBroadcastIp, kResultPort, 0, expected);
  }

  std::unique_ptr<SwitchDataplane> dataplane_;
};

TEST_P(SwitchProgramTest, ThreeWorkersSumAndBroadcastResult) {
  start_job(3);
  expect_dropped(data(2, 5));
  expect_dropped(data(0, 5));
  RunResult result = run(data(1, 5));
  expect_broadcast(result, data(1, 5), sum_of(3, 5));
  EXPECT_EQ(dataplane_->counters(), counters_with({{XSW_CNT_AGGREGATED, 2}, {XSW_CNT_COMPLETED, 1}}));
}

TEST_P(SwitchProgramTest, MaxOperation) {
  start_job(2);
  expect_dropped(data(0, 1, 0, XSW_OP_MAX));
  RunResult result = run(data(1, 1, 0, XSW_OP_MAX));
  Values expected(elements());
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = std::max(data(0, 1).values[i], data(1, 1).values[i]);
  expect_broadcast(result, data(1, 1), expected);
}

// SwitchML's shadow copies: a slot's two copies alternate, and a copy is used
// again (count and seen bits from its previous use) once every rank sent into
// the other one. Three uses of each copy of a slot, all complete and exact.
TEST_P(SwitchProgramTest, SlotCopiesAreReusedInTurn) {
  start_job(2);
  const uint32_t slot = 2;
  for (uint32_t use = 0; use < 6; ++use) {
    const uint32_t block = slot + use * kPoolSlots;
    const uint8_t ver = use % 2;
    expect_dropped(data(1, block, ver));
    RunResult result = run(data(0, block, ver));
    expect_broadcast(result, data(0, block, ver), sum_of(2, block));
  }
  EXPECT_EQ(dataplane_->counters(), counters_with({{XSW_CNT_AGGREGATED, 6}, {XSW_CNT_COMPLETED, 6}}));
}

TEST_P(SwitchProgramTest, RetransmissionsAreIgnoredThenAnsweredByUnicast) {
  start_job(2);
  expect_dropped(data(0, 3));
  expect_dropped(data(0, 3));  // before completion: not added twice
  run(data(1, 3));
  RunResult resend = run(data(0, 3));  // after completion: its sender lost the result
  const auto* eth = reinterpret_cast<const ethhdr*>(resend.out.data());
  ASSERT_EQ(resend.verdict, XDP_TX);
  EXPECT_EQ(0, std::memcmp(eth->h_dest, worker_mac(0).data(), ETH_ALEN));
  expect_result(resend, data(0, 3), worker_ip(0), kResultPort, XSW_FLAG_RESEND, sum_of(2, 3));
  EXPECT_EQ(dataplane_->counters(), counters_with({{XSW_CNT_AGGREGATED, 1},
                                                   {XSW_CNT_IGNORED, 1},
                                                   {XSW_CNT_COMPLETED, 1},
                                                   {XSW_CNT_RESENT, 1}}));
}

// Ranks of one job with different packet sizes: the slot keeps its first
// share's length and drops the other, instead of adding unrelated elements.
TEST_P(SwitchProgramTest, ShareOfAnotherLengthIsDropped) {
  start_job(2);
  expect_dropped(data(0, 4));
  Packet other_length = data(1, 4);
  other_length.values.resize(elements() == XSW_MAX_PACKET_ELEMS ? elements() / 2 : elements() * 2);
  EXPECT_EQ(run(other_length).verdict, XDP_DROP);
  RunResult result = run(data(1, 4));
  expect_broadcast(result, data(1, 4), sum_of(2, 4));
  EXPECT_EQ(dataplane_->counters(),
            counters_with({{XSW_CNT_AGGREGATED, 1}, {XSW_CNT_LENGTH_MISMATCH, 1}, {XSW_CNT_COMPLETED, 1}}));
}

TEST_P(SwitchProgramTest, MalformedOrForeignPacketsAreRejected) {
  start_job(2, kPoolSlots / 2);
  auto mutated = [&](auto&& change) {
    Frame frame = build_frame(data(0, 1));
    change(frame);
    return run(frame).verdict;
  };
  auto udp_of = [](Frame& frame) { return reinterpret_cast<udphdr*>(frame.data() + kUdpOffset); };
  auto header_of = [](Frame& frame) { return reinterpret_cast<xsw_hdr*>(frame.data() + kHeaderOffset); };
  auto add_bytes = [&](Frame& frame, int bytes) {
    auto* ip = reinterpret_cast<iphdr*>(frame.data() + kIpOffset);
    ip->tot_len = htons(static_cast<uint16_t>(ntohs(ip->tot_len) + bytes));
    udp_of(frame)->len = htons(static_cast<uint16_t>(ntohs(udp_of(frame)->len) + bytes));
  };
  EXPECT_EQ(mutated([&](Frame& f) { udp_of(f)->len = htons(ntohs(udp_of(f)->len) - 4); }), XDP_DROP);  // != IP's
  EXPECT_EQ(mutated([&](Frame& f) { add_bytes(f, 4); }), XDP_DROP);  // more than the frame holds
  EXPECT_EQ(mutated([&](Frame& f) { add_bytes(f, -2), f.resize(f.size() - 2); }), XDP_DROP);  // half an element
  EXPECT_EQ(mutated([&](Frame& f) { header_of(f)->token ^= 1; }), XDP_DROP);
  EXPECT_EQ(mutated([&](Frame& f) { header_of(f)->slot = htons(kPoolSlots / 2); }), XDP_DROP);  // past the job's
  EXPECT_EQ(mutated([&](Frame& f) { header_of(f)->rank = htons(2); }), XDP_DROP);
  Packet too_long = data(0, 1);
  too_long.values.resize(XSW_MAX_PACKET_ELEMS + 1);
  EXPECT_EQ(run(too_long).verdict, XDP_DROP);
  EXPECT_EQ(dataplane_->counters(), counters_with({{XSW_CNT_REJECTED, 7}}));
  // None of them touched the slot: the real shares complete it exactly.
  expect_dropped(data(0, 1));
  expect_broadcast(run(data(1, 1)), data(1, 1), sum_of(2, 1));
}

// Two CPUs merge into the same slots at once, round after round through the
// pool: with the slot lock no share may be lost and every result is exact.
TEST_P(SwitchProgramTest, ConcurrentCpusLoseNoUpdate) {
  ASSERT_GE(std::thread::hardware_concurrency(), 2u) << "the concurrency test needs two CPUs";
  constexpr uint32_t kRounds = 100;
  start_job(2);
  std::barrier round_done(2);
  std::array<uint32_t, 2> completed{}, wrong{};
  auto sender = [&](uint32_t rank) {
    pin_to_cpu(static_cast<int>(rank));
    for (uint32_t round = 0; round < kRounds; ++round) {
      for (uint32_t slot = 0; slot < kPoolSlots; ++slot) {
        const uint32_t block = round * kPoolSlots + slot;
        RunResult result = run(data(rank, block, round % 2));
        if (result.verdict != XDP_TX) continue;
        ++completed[rank];
        if (payload_of(result.out) != sum_of(2, block)) ++wrong[rank];
      }
      round_done.arrive_and_wait();  // a slot's next use only once both ranks sent into this one
    }
  };
  std::thread other(sender, 1);
  sender(0);
  other.join();
  EXPECT_EQ(completed[0] + completed[1], kRounds * kPoolSlots);
  EXPECT_EQ(wrong[0] + wrong[1], 0u);
  EXPECT_EQ(dataplane_->counters(),
            counters_with({{XSW_CNT_AGGREGATED, kRounds * kPoolSlots}, {XSW_CNT_COMPLETED, kRounds * kPoolSlots}}));
}

INSTANTIATE_TEST_SUITE_P(PacketElems, SwitchProgramTest,
                         ::testing::Values(uint32_t{XSW_DEFAULT_PACKET_ELEMS}, uint32_t{XSW_MAX_PACKET_ELEMS}, 100u),
                         [](const ::testing::TestParamInfo<uint32_t>& info) { return std::to_string(info.param); });

TEST(SwitchDataplaneTest, JobLargerThanThePoolIsRefused) {
  ASSERT_EQ(geteuid(), 0u) << "switch_bpf_tests loads XDP programs and must run as root";
  SwitchDataplane dataplane(kDataPort, kPoolSlots);
  xsw_config config{};
  config.slots = kPoolSlots + 1;
  EXPECT_THROW(dataplane.start_job(config, {}), std::invalid_argument);
}

}  // namespace
}  // namespace xagg::baselines::switchml
