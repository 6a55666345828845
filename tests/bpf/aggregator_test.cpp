// Runs the XDP aggregator on hand-built Ethernet/IPv4/UDP frames with
// BPF_PROG_TEST_RUN and checks its verdicts, its output frames and its counters.
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
#include <thread>

#include "dataplane.h"
#include "wire.h"

namespace xagg::dataplane {
namespace {

using Frame = std::vector<uint8_t>;

constexpr size_t kIpOffset = sizeof(ethhdr);
constexpr size_t kUdpOffset = kIpOffset + sizeof(iphdr);
constexpr size_t kXaggOffset = kUdpOffset + sizeof(udphdr);
constexpr size_t kPayloadOffset = kXaggOffset + wire::kHeaderBytes;
constexpr size_t kFrameBytes = kPayloadOffset + wire::kChunkElems * 4;

constexpr uint32_t kJobId = 7;
constexpr uint64_t kToken = 0x1122334455667788;
constexpr uint32_t kChunks = 4;
constexpr uint16_t kResultPort = 20000;
constexpr std::array<uint8_t, ETH_ALEN> kAggregatorMac{0x02, 0, 0, 0, 0, 0xaa};
const in_addr kAggregatorIp{inet_addr("198.18.0.1")};
const in_addr kBroadcastIp{inet_addr("198.18.0.255")};

in_addr worker_ip(uint32_t rank) { return in_addr{htonl(ntohl(inet_addr("198.18.0.10")) + rank)}; }
std::array<uint8_t, ETH_ALEN> worker_mac(uint32_t rank) { return {0x02, 0, 0, 0, 1, static_cast<uint8_t>(rank)}; }

using Values = std::vector<int32_t>;

// rank's share of a chunk: distinct per rank, iteration and element, with negatives.
Values share(uint32_t rank, uint32_t iteration) {
  Values values(wire::kChunkElems);
  for (size_t i = 0; i < values.size(); i++)
    values[i] = static_cast<int32_t>((i * 7 + 1) * (rank + 1) * (iteration + 1)) * (i % 2 ? -1 : 1);
  return values;
}

Values sum_of(std::initializer_list<Values> shares) {
  Values sum(wire::kChunkElems);
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
  size_t payload_bytes = wire::kChunkElems * 4;  // anything else makes a malformed packet
};

Frame build_frame(const FrameSpec& spec) {
  Frame frame(kPayloadOffset + spec.payload_bytes);
  auto* eth = reinterpret_cast<ethhdr*>(frame.data());
  std::memcpy(eth->h_dest, kAggregatorMac.data(), ETH_ALEN);
  std::memcpy(eth->h_source, spec.src_mac.data(), ETH_ALEN);
  eth->h_proto = htons(ETH_P_IP);
  auto* ip = reinterpret_cast<iphdr*>(frame.data() + kIpOffset);
  ip->version = 4;
  ip->ihl = 5;
  ip->tot_len = htons(static_cast<uint16_t>(frame.size() - kIpOffset));
  ip->ttl = 64;
  ip->protocol = IPPROTO_UDP;
  ip->saddr = spec.src_ip.s_addr;
  ip->daddr = kAggregatorIp.s_addr;
  auto* udp = reinterpret_cast<udphdr*>(frame.data() + kUdpOffset);
  udp->source = htons(spec.src_port);
  udp->dest = htons(spec.dst_port);
  udp->len = htons(static_cast<uint16_t>(frame.size() - kUdpOffset));
  wire::encode_header(spec.header, std::as_writable_bytes(std::span(frame).subspan(kXaggOffset)));
  size_t value_bytes = std::min(spec.payload_bytes, spec.values.size() * 4);
  std::memcpy(frame.data() + kPayloadOffset, spec.values.data(), value_bytes);
  return frame;
}

iphdr* ip_of(Frame& frame) { return reinterpret_cast<iphdr*>(frame.data() + kIpOffset); }
xagg_hdr* xagg_of(Frame& frame) { return reinterpret_cast<xagg_hdr*>(frame.data() + kXaggOffset); }

Values payload_of(const Frame& frame) {
  Values values(wire::kChunkElems);
  std::memcpy(values.data(), frame.data() + kPayloadOffset, values.size() * 4);
  return values;
}

bool ipv4_checksum_valid(const Frame& frame) {
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

RunResult run_program(int prog_fd, const Frame& in, int repeat = 1) {
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

CounterRow counters_with(std::initializer_list<std::pair<xagg_counter, uint64_t>> nonzero) {
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

  void add_job(uint32_t world_size, uint32_t registered_ranks) {
    JobSpec job{kJobId, kToken, world_size, kChunks, kBroadcastIp, kResultPort, {}};
    for (uint32_t rank = 0; rank < registered_ranks; rank++) job.workers.push_back({rank, worker_ip(rank), kResultPort});
    slot_ = dataplane_->add_job(job);
  }
  void add_job(uint32_t world_size) { add_job(world_size, world_size); }

  static FrameSpec data(uint32_t rank, uint32_t chunk, uint32_t iteration, wire::ElemOp op = wire::ElemOp::Sum) {
    FrameSpec spec;
    spec.header = {wire::MsgType::Data, kJobId, kToken, iteration, chunk, static_cast<uint16_t>(rank), op, 0};
    spec.values = share(rank, iteration);
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
    ASSERT_EQ(result.out.size(), kFrameBytes);
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

TEST_F(AggregatorTest, TwoWorkersSumAndBroadcastResult) {
  add_job(2);
  expect_dropped(data(0, 1, 0));
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 1}}));
  RunResult result = run(data(1, 1, 0));
  expect_broadcast_result(result, 1, 0, sum_of({share(0, 0), share(1, 0)}));
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 1}, {XAGG_CNT_COMPLETED, 1}}));
  EXPECT_EQ(no_job_counters(), CounterRow{});
  auto snapshot = dataplane_->counters();
  ASSERT_EQ(snapshot.jobs.size(), 1u);
  EXPECT_EQ(snapshot.jobs[0].job_id, kJobId);
  EXPECT_EQ(snapshot.jobs[0].slot, slot_);
}

TEST_F(AggregatorTest, ThreeWorkersSumInAnyOrder) {
  add_job(3);
  expect_dropped(data(2, 3, 5));
  expect_dropped(data(0, 3, 5));
  RunResult result = run(data(1, 3, 5));
  expect_broadcast_result(result, 3, 5, sum_of({share(0, 5), share(1, 5), share(2, 5)}));
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 2}, {XAGG_CNT_COMPLETED, 1}}));
}

TEST_F(AggregatorTest, MaxOperation) {
  add_job(2);
  expect_dropped(data(0, 0, 0, wire::ElemOp::Max));
  RunResult result = run(data(1, 0, 0, wire::ElemOp::Max));
  Values expected(wire::kChunkElems);
  for (size_t i = 0; i < expected.size(); i++) expected[i] = std::max(share(0, 0)[i], share(1, 0)[i]);
  expect_broadcast_result(result, 0, 0, expected);
}

TEST_F(AggregatorTest, DuplicateIsCountedNotAdded) {
  add_job(2);
  expect_dropped(data(0, 2, 0));
  expect_dropped(data(0, 2, 0));
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 1}, {XAGG_CNT_DUPLICATE, 1}}));
  RunResult result = run(data(1, 2, 0));
  expect_broadcast_result(result, 2, 0, sum_of({share(0, 0), share(1, 0)}));
}

TEST_F(AggregatorTest, DuplicateAfterCompletionIsAnsweredByUnicast) {
  add_job(2);
  expect_dropped(data(0, 2, 0));
  run(data(1, 2, 0));
  RunResult result = run(data(0, 2, 0));
  ASSERT_EQ(result.verdict, XDP_TX);
  auto* eth = reinterpret_cast<ethhdr*>(result.out.data());
  EXPECT_EQ(0, std::memcmp(eth->h_dest, worker_mac(0).data(), ETH_ALEN));
  EXPECT_EQ(0, std::memcmp(eth->h_source, kAggregatorMac.data(), ETH_ALEN));
  expect_result_header(result, 2, 0, worker_ip(0), kResultPort, XAGG_FLAG_RESEND, sum_of({share(0, 0), share(1, 0)}));
  EXPECT_EQ(job_counters(),
            counters_with({{XAGG_CNT_AGGREGATED, 1}, {XAGG_CNT_COMPLETED, 1}, {XAGG_CNT_RESENT, 1}}));
}

TEST_F(AggregatorTest, StaleIterationIsDropped) {
  add_job(2);
  expect_dropped(data(0, 0, 3));
  expect_dropped(data(1, 0, 1));  // same cell (odd iterations), older
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 1}, {XAGG_CNT_STALE, 1}}));
  RunResult result = run(data(1, 0, 3));
  expect_broadcast_result(result, 0, 3, sum_of({share(0, 3), share(1, 3)}));
}

TEST_F(AggregatorTest, NextIterationDoesNotDisturbCurrentOne) {
  add_job(2);
  expect_dropped(data(0, 1, 0));
  expect_dropped(data(0, 1, 1));  // rank 0 runs ahead into the other parity cell
  RunResult current = run(data(1, 1, 0));
  expect_broadcast_result(current, 1, 0, sum_of({share(0, 0), share(1, 0)}));
  RunResult resent = run(data(1, 1, 0));  // iteration 0's result is still there
  ASSERT_EQ(resent.verdict, XDP_TX);
  EXPECT_EQ(payload_of(resent.out), sum_of({share(0, 0), share(1, 0)}));
  RunResult next = run(data(1, 1, 1));
  expect_broadcast_result(next, 1, 1, sum_of({share(0, 1), share(1, 1)}));
  EXPECT_EQ(job_counters(),
            counters_with({{XAGG_CNT_AGGREGATED, 2}, {XAGG_CNT_COMPLETED, 2}, {XAGG_CNT_RESENT, 1}}));
}

TEST_F(AggregatorTest, MalformedPacketsAreDropped) {
  add_job(2);
  std::vector<Frame> malformed;
  auto mutated = [&](auto change) {
    Frame frame = build_frame(data(0, 0, 0));
    change(frame);
    malformed.push_back(frame);
  };
  mutated([](Frame& f) { xagg_of(f)->magic = htons(0x1234); });
  mutated([](Frame& f) { xagg_of(f)->reserved = htonl(1); });
  mutated([](Frame& f) { xagg_of(f)->flags = XAGG_FLAG_RESEND; });
  mutated([](Frame& f) { xagg_of(f)->type = XAGG_MSG_RESULT; });
  mutated([](Frame& f) { xagg_of(f)->op = XAGG_OP_COUNT; });
  mutated([](Frame& f) { ip_of(f)->frag_off = htons(0x2000); });  // more fragments
  mutated([](Frame& f) { ip_of(f)->frag_off = htons(8); });       // a later fragment
  for (size_t payload_bytes : {size_t{0}, size_t{100}, wire::kChunkElems * 4 - 4, wire::kChunkElems * 4 + 4}) {
    FrameSpec spec = data(0, 0, 0);
    spec.payload_bytes = payload_bytes;  // short or long, IP and UDP lengths agree with it
    malformed.push_back(build_frame(spec));
  }
  mutated([](Frame& f) { f.resize(f.size() - 4); });  // lengths claim more than the frame holds
  for (const Frame& frame : malformed) expect_dropped(frame);
  EXPECT_EQ(no_job_counters(), counters_with({{XAGG_CNT_MALFORMED, malformed.size()}}));
  EXPECT_EQ(job_counters(), CounterRow{});
}

TEST_F(AggregatorTest, BadVersionIsDropped) {
  add_job(2);
  Frame frame = build_frame(data(0, 0, 0));
  xagg_of(frame)->version = XAGG_VERSION + 1;
  expect_dropped(frame);
  EXPECT_EQ(no_job_counters(), counters_with({{XAGG_CNT_BAD_VERSION, 1}}));
}

TEST_F(AggregatorTest, UnknownJobIsDropped) {
  add_job(2);
  FrameSpec spec = data(0, 0, 0);
  spec.header.job_id = kJobId + 1;
  expect_dropped(spec);
  EXPECT_EQ(no_job_counters(), counters_with({{XAGG_CNT_UNKNOWN_JOB, 1}}));
}

TEST_F(AggregatorTest, RemovedJobIsUnknownAndItsCountersCleared) {
  add_job(2);
  expect_dropped(data(0, 0, 0));
  dataplane_->remove_job(kJobId);
  expect_dropped(data(1, 0, 0));
  EXPECT_EQ(no_job_counters(), counters_with({{XAGG_CNT_UNKNOWN_JOB, 1}}));
  add_job(2);  // same slot again: fresh cells and counters
  EXPECT_EQ(job_counters(), CounterRow{});
  expect_dropped(data(1, 0, 0));
  RunResult result = run(data(0, 0, 0));
  expect_broadcast_result(result, 0, 0, sum_of({share(0, 0), share(1, 0)}));
}

TEST_F(AggregatorTest, BadTokenIsDropped) {
  add_job(2);
  FrameSpec spec = data(0, 0, 0);
  spec.header.token = kToken ^ 1;
  expect_dropped(spec);
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_BAD_TOKEN, 1}}));
}

TEST_F(AggregatorTest, UnregisteredRankIsDropped) {
  add_job(3, 2);
  expect_dropped(data(2, 0, 0));
  FrameSpec beyond_world = data(0, 0, 0);
  beyond_world.header.rank = 64;
  expect_dropped(beyond_world);
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_UNKNOWN_WORKER, 2}}));
  dataplane_->add_worker(kJobId, {2, worker_ip(2), kResultPort});
  expect_dropped(data(2, 0, 0));
  EXPECT_EQ(job_counters()[XAGG_CNT_AGGREGATED], 1u);
}

TEST_F(AggregatorTest, WrongSourceIsDropped) {
  add_job(2);
  FrameSpec other_address = data(0, 0, 0);
  other_address.src_ip = worker_ip(1);
  FrameSpec other_port = data(0, 0, 0);
  other_port.src_port = kResultPort + 1;
  expect_dropped(other_address);
  expect_dropped(other_port);
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_WRONG_SOURCE, 2}}));
}

TEST_F(AggregatorTest, ChunkOutOfRangeIsDropped) {
  add_job(2);
  expect_dropped(data(0, kChunks, 0));
  expect_dropped(data(0, UINT32_MAX, 0));
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_OUT_OF_RANGE, 2}}));
}

TEST_F(AggregatorTest, OpMismatchIsDropped) {
  add_job(2);
  expect_dropped(data(0, 0, 0, wire::ElemOp::Sum));
  expect_dropped(data(1, 0, 0, wire::ElemOp::Max));
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 1}, {XAGG_CNT_OP_MISMATCH, 1}}));
}

TEST_F(AggregatorTest, OtherTrafficPasses) {
  add_job(2);
  Frame arp(64);
  reinterpret_cast<ethhdr*>(arp.data())->h_proto = htons(ETH_P_ARP);
  FrameSpec other_port = data(0, 0, 0);
  other_port.dst_port = wire::kDefaultDataPort + 1;
  Frame tcp = build_frame(data(0, 0, 0));
  ip_of(tcp)->protocol = IPPROTO_TCP;
  for (const Frame& frame : {arp, build_frame(other_port), tcp}) EXPECT_EQ(run(frame).verdict, XDP_PASS);
  EXPECT_EQ(no_job_counters(), CounterRow{});
  EXPECT_EQ(job_counters(), CounterRow{});
}

void pin_to_cpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(set), &set), 0);
}

// Two CPUs merge into the same cells at the same time: with the cell lock no
// share may be lost, so every chunk of every iteration completes exactly.
TEST_F(AggregatorTest, ConcurrentCpusLoseNoUpdate) {
  ASSERT_GE(std::thread::hardware_concurrency(), 2u) << "the concurrency test needs two CPUs";
  constexpr uint32_t kIterations = 300;
  add_job(2);
  std::barrier iteration_done(2);
  std::array<uint32_t, 2> completed{};
  std::array<uint32_t, 2> wrong_results{};
  auto hammer = [&](uint32_t rank) {
    pin_to_cpu(static_cast<int>(rank));
    for (uint32_t iteration = 0; iteration < kIterations; iteration++) {
      Values expected = sum_of({share(0, iteration), share(1, iteration)});
      for (uint32_t chunk = 0; chunk < kChunks; chunk++) {
        RunResult result = run(data(rank, chunk, iteration));
        if (result.verdict != XDP_TX) continue;
        completed[rank]++;
        if (payload_of(result.out) != expected) wrong_results[rank]++;
      }
      iteration_done.arrive_and_wait();  // keeps both ranks within one iteration
    }
  };
  std::thread other(hammer, 1);
  hammer(0);
  other.join();
  EXPECT_EQ(completed[0] + completed[1], kIterations * kChunks);
  EXPECT_EQ(wrong_results[0] + wrong_results[1], 0u);
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, kIterations * kChunks},
                                           {XAGG_CNT_COMPLETED, kIterations * kChunks}}));
}

// Many repeats of one frame per CPU: every repeat after the first is a duplicate.
TEST_F(AggregatorTest, RepeatedFramesOnTwoCpusCountEachShareOnce) {
  add_job(3);
  constexpr int kRepeat = 2000;
  auto hammer = [&](uint32_t rank) {
    pin_to_cpu(static_cast<int>(rank));
    EXPECT_EQ(run_program(dataplane_->program_fd(), build_frame(data(rank, 1, 0)), kRepeat).verdict, XDP_DROP);
  };
  std::thread other(hammer, 1);
  hammer(0);
  other.join();
  RunResult result = run(data(2, 1, 0));
  expect_broadcast_result(result, 1, 0, sum_of({share(0, 0), share(1, 0), share(2, 0)}));
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 2},
                                           {XAGG_CNT_DUPLICATE, 2 * (kRepeat - 1)},
                                           {XAGG_CNT_COMPLETED, 1}}));
}

}  // namespace
}  // namespace xagg::dataplane
