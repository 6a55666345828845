// Runs the XDP aggregator on hand-built Ethernet/IPv4/UDP frames with
// BPF_PROG_TEST_RUN and checks its verdicts, its output frames and its counters.
#include <pthread.h>

#include <algorithm>
#include <barrier>
#include <thread>

#include "aggregator_fixture.h"

namespace xagg::dataplane::bpf_test {
namespace {

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

// A multicast job's result goes to its group: the group's IPv4 address and its MAC (01:00:5e, low 23 bits).
TEST_F(AggregatorTest, MulticastJobSendsTheResultToItsGroup) {
  const in_addr group{inet_addr("239.146.0.5")};  // bit 23 (0x92 & 0x80) is left out of the MAC
  add_job(2, 2, wire::kChunkElems, wire::ResultMode::Multicast, group);
  expect_dropped(data(0, 1, 0));
  RunResult result = run(data(1, 1, 0));
  ASSERT_EQ(result.verdict, XDP_TX);
  auto* eth = reinterpret_cast<ethhdr*>(result.out.data());
  EXPECT_EQ(std::vector<uint8_t>(eth->h_dest, eth->h_dest + ETH_ALEN),
            (std::vector<uint8_t>{0x01, 0x00, 0x5e, 0x12, 0x00, 0x05}));
  expect_result_header(result, 1, 0, group, kResultPort, 0, sum_of({share(0, 0), share(1, 0)}));
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 1}, {XAGG_CNT_COMPLETED, 1}}));
}

// A unicast job's result goes to the stack, for the tc program to copy to
// every rank; a resend stays XDP_TX to the sender.
TEST_F(AggregatorTest, UnicastJobPassesTheResultToTheFanOut) {
  add_job(2, 2, wire::kChunkElems, wire::ResultMode::Unicast, in_addr{});
  expect_dropped(data(0, 1, 0));
  RunResult result = run(data(1, 1, 0));
  ASSERT_EQ(result.verdict, XDP_PASS);
  expect_result_header(result, 1, 0, in_addr{}, kResultPort, 0, sum_of({share(0, 0), share(1, 0)}));
  RunResult resend = run(data(0, 1, 0));
  ASSERT_EQ(resend.verdict, XDP_TX);
  expect_result_header(resend, 1, 0, worker_ip(0), kResultPort, XAGG_FLAG_RESEND, sum_of({share(0, 0), share(1, 0)}));
}

// A reduce-scatter chunk (protocol.md section 10), in a broadcast job: its
// result goes to the fan-out whatever the job's mode, naming its owner;
// a resend answers with the values and the owner.
TEST_F(AggregatorTest, ScatterChunkGoesToTheFanOutNamingItsOwner) {
  add_job(3);
  auto scattered = [this](uint32_t rank, bool owner) {
    FrameSpec spec = data(rank, 1, 2);
    spec.header.flags = XAGG_FLAG_SCATTER | (owner ? XAGG_FLAG_OWNER : 0);
    return spec;
  };
  expect_dropped(scattered(0, false));
  expect_dropped(scattered(2, true));
  RunResult result = run(scattered(1, false));
  ASSERT_EQ(result.verdict, XDP_PASS);
  const Values sum = sum_of({share(0, 2), share(1, 2), share(2, 2)});
  expect_result_header(result, 1, 2, kBroadcastIp, kResultPort, XAGG_FLAG_SCATTER, sum);
  EXPECT_EQ(ntohs(xagg_of(result.out)->rank), 2);
  RunResult resend = run(scattered(0, false));
  ASSERT_EQ(resend.verdict, XDP_TX);
  expect_result_header(resend, 1, 2, worker_ip(0), kResultPort, XAGG_FLAG_RESEND | XAGG_FLAG_SCATTER, sum);
  EXPECT_EQ(ntohs(xagg_of(resend.out)->rank), 2);
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 2}, {XAGG_CNT_COMPLETED, 1}, {XAGG_CNT_RESENT, 1}}));
}

// Every share of a use must agree on SCATTER, and a chunk has one owner.
TEST_F(AggregatorTest, ScatterSharesThatDisagreeAreOpMismatches) {
  add_job(3);
  FrameSpec owner = data(0, 1, 0);
  owner.header.flags = XAGG_FLAG_SCATTER | XAGG_FLAG_OWNER;
  expect_dropped(owner);
  expect_dropped(data(1, 1, 0));  // no SCATTER
  FrameSpec second_owner = data(2, 1, 0);
  second_owner.header.flags = XAGG_FLAG_SCATTER | XAGG_FLAG_OWNER;
  expect_dropped(second_owner);
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 1}, {XAGG_CNT_OP_MISMATCH, 2}}));
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

// The ECN echo (protocol.md 3.3): CE on any share of a use sets the RESULT's
// CE flag, broadcast or resent; the RESULT itself leaves Not-ECT; the next use
// of the cell starts unmarked, and a resend asked by a marked DATA echoes its mark.
TEST_F(AggregatorTest, CeOnAnyShareIsEchoedInTheResult) {
  add_job(3);
  auto with_ecn = [](const FrameSpec& spec, uint8_t ecn) {
    Frame frame = build_frame(spec);
    ip_of(frame)->tos = ecn;
    return frame;
  };
  const Values sum = sum_of({share(0, 0), share(1, 0), share(2, 0)});
  expect_dropped(with_ecn(data(0, 1, 0), XAGG_ECN_ECT0));
  expect_dropped(with_ecn(data(1, 1, 0), XAGG_ECN_CE));
  RunResult marked = run(with_ecn(data(2, 1, 0), XAGG_ECN_ECT0));
  ASSERT_EQ(marked.verdict, XDP_TX);
  expect_result_header(marked, 1, 0, kBroadcastIp, kResultPort, XAGG_FLAG_CE, sum);
  EXPECT_EQ(ip_of(marked.out)->tos & XAGG_ECN_MASK, 0);
  RunResult resent = run(with_ecn(data(0, 1, 0), XAGG_ECN_ECT0));
  ASSERT_EQ(resent.verdict, XDP_TX);
  expect_result_header(resent, 1, 0, worker_ip(0), kResultPort, XAGG_FLAG_RESEND | XAGG_FLAG_CE, sum);

  const Values next_sum = sum_of({share(0, 2), share(1, 2), share(2, 2)});
  expect_dropped(with_ecn(data(0, 1, 2), XAGG_ECN_ECT0));
  expect_dropped(with_ecn(data(1, 1, 2), XAGG_ECN_ECT0));
  RunResult unmarked = run(with_ecn(data(2, 1, 2), XAGG_ECN_ECT0));
  expect_broadcast_result(unmarked, 1, 2, next_sum);
  RunResult asked = run(with_ecn(data(1, 1, 2), XAGG_ECN_CE));
  ASSERT_EQ(asked.verdict, XDP_TX);
  expect_result_header(asked, 1, 2, worker_ip(1), kResultPort, XAGG_FLAG_RESEND | XAGG_FLAG_CE, next_sum);
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
  mutated([](Frame& f) { xagg_of(f)->flags = XAGG_FLAG_RESEND; });
  mutated([](Frame& f) { xagg_of(f)->flags = XAGG_FLAG_OWNER; });  // OWNER without SCATTER
  mutated([](Frame& f) { xagg_of(f)->flags = XAGG_FLAG_SCATTER | 32; });
  mutated([](Frame& f) { xagg_of(f)->type = XAGG_MSG_DATA + 7; });
  mutated([](Frame& f) { xagg_of(f)->op = XAGG_OP_COUNT; });
  mutated([](Frame& f) { ip_of(f)->frag_off = htons(0x2000); });  // more fragments
  for (size_t payload_bytes : {size_t{0}, size_t{2}, size_t{102}, wire::kChunkElems * 4 - 2, wire::kChunkElems * 4 + 4}) {
    FrameSpec spec = data(0, 0, 0);
    spec.payload_bytes = payload_bytes;  // no element, part of one or too many; IP and UDP lengths agree with it
    malformed.push_back(build_frame(spec));
  }
  mutated([](Frame& f) { f.resize(f.size() - 4); });  // lengths claim more than the frame holds
  for (const Frame& frame : malformed) expect_dropped(frame);
  // A RESULT is taken only from a leaf job's parent (protocol.md section 9): this job has none.
  Frame result = build_frame(data(0, 0, 0));
  xagg_of(result)->type = XAGG_MSG_RESULT;
  expect_dropped(result);
  EXPECT_EQ(no_job_counters(), counters_with({{XAGG_CNT_MALFORMED, malformed.size()}, {XAGG_CNT_UNKNOWN_JOB, 1}}));
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

// A tensor's last chunk is short: only its own elements are summed and come
// back, whatever a longer earlier use of the cell, or a longer share merged
// before on this CPU, left past its end.
TEST_F(AggregatorTest, ShortChunksCarryOnlyTheirElements) {
  add_job(2);
  expect_dropped(data(0, 1, 0));
  auto full = run(data(1, 1, 0));
  expect_broadcast_result(full, 1, 0, sum_of({share(0, 0), share(1, 0)}));
  for (uint32_t iteration : {2u, 4u}) {
    const size_t elements = iteration == 2 ? 100 : 1;  // a partial merge block; a single element
    expect_dropped(data(0, 1, iteration, wire::ElemOp::Sum, elements));
    auto result = run(data(1, 1, iteration, wire::ElemOp::Sum, elements));
    expect_broadcast_result(result, 1, iteration,
                            sum_of({share(0, iteration, elements), share(1, iteration, elements)}));
  }
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 3}, {XAGG_CNT_COMPLETED, 3}}));
}

// A share of an all-reduce of another size (the header's total) is refused
// like a share of another length, and the cell names it, so that a status
// answer can tell every rank that the tensors differ.
TEST_F(AggregatorTest, ShareOfAnotherSizedAllreduceIsRefusedAndRecorded) {
  add_job(2);
  FrameSpec first = data(0, 0, 0);
  first.header.total = 5000;
  expect_dropped(first);
  FrameSpec other = data(1, 0, 0);
  other.header.total = 3000;
  expect_dropped(other);
  dataplane::CellState cell = dataplane_->cell_state(kJobId, 0, 0);
  EXPECT_EQ(cell.arrived, 1u);
  EXPECT_EQ(cell.total, 5000u);
  EXPECT_EQ(cell.conflict_total, 3000u);
  EXPECT_EQ(cell.conflict_rank, 1u);
  other.header.total = 5000;
  RunResult result = run(other);
  expect_broadcast_result(result, 0, 0, sum_of({share(0, 0), share(1, 0)}));
  EXPECT_EQ(job_counters(),
            counters_with({{XAGG_CNT_AGGREGATED, 1}, {XAGG_CNT_LENGTH_MISMATCH, 1}, {XAGG_CNT_COMPLETED, 1}}));
  // A new iteration of the cell forgets the conflict.
  FrameSpec next = data(0, 0, 2);
  next.header.total = 5000;
  expect_dropped(next);
  EXPECT_EQ(dataplane_->cell_state(kJobId, 0, 2).conflict_total, 0u);
}

TEST_F(AggregatorTest, LengthMismatchIsDropped) {
  add_job(2);
  expect_dropped(data(0, 0, 0, wire::ElemOp::Sum, 100));
  expect_dropped(data(1, 0, 0, wire::ElemOp::Sum, 101));
  expect_dropped(data(1, 0, 0, wire::ElemOp::Sum));
  auto result = run(data(1, 0, 0, wire::ElemOp::Sum, 100));
  expect_broadcast_result(result, 0, 0, sum_of({share(0, 0, 100), share(1, 0, 100)}));
  EXPECT_EQ(job_counters(),
            counters_with({{XAGG_CNT_AGGREGATED, 1}, {XAGG_CNT_LENGTH_MISMATCH, 2}, {XAGG_CNT_COMPLETED, 1}}));
}

// Jobs on links of smaller MTUs get cells of a smaller class (one map of maps
// each): whole chunks of the job's size, up to the class's capacity, sum
// without touching the neighbouring chunk's cells; a longer share has no room.
class CellClassTest : public AggregatorTest, public ::testing::WithParamInterface<uint32_t> {};

TEST_P(CellClassTest, ChunksOfTheJobsSizeSumInCellsOfItsClass) {
  const uint32_t chunk_elements = GetParam();
  const uint32_t capacity = wire::cell_capacity(wire::cell_class_for(chunk_elements));
  add_job(2, 2, chunk_elements);
  for (uint32_t chunk : {0u, 1u}) {
    const size_t elements = chunk == 0 ? chunk_elements : capacity;  // the job's chunks; all a cell holds
    expect_dropped(data(0, chunk, 0, wire::ElemOp::Sum, elements));
    auto result = run(data(1, chunk, 0, wire::ElemOp::Sum, elements));
    expect_broadcast_result(result, chunk, 0, sum_of({share(0, 0, elements), share(1, 0, elements)}));
  }
  expect_dropped(data(0, 2, 0, wire::ElemOp::Max, 8));
  auto max = run(data(1, 2, 0, wire::ElemOp::Max, 8));
  Values expected = share(0, 0, 8);
  for (size_t i = 0; i < expected.size(); i++) expected[i] = std::max(expected[i], share(1, 0, 8)[i]);
  expect_broadcast_result(max, 2, 0, expected);
  if (capacity < wire::kChunkElems) expect_dropped(data(0, 3, 0, wire::ElemOp::Sum, capacity + 8));
  EXPECT_EQ(dataplane_->cell_state(kJobId, 3, 0).started, false) << "the long share reached a cell";
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 3},
                                           {XAGG_CNT_COMPLETED, 3},
                                           {XAGG_CNT_LENGTH_MISMATCH, capacity < wire::kChunkElems ? 1u : 0u}}));
}

INSTANTIATE_TEST_SUITE_P(ChunkSizesOfMtus, CellClassTest,
                         ::testing::Values(wire::chunk_elements_for(1500), wire::chunk_elements_for(4000),
                                           static_cast<uint32_t>(wire::kChunkElems)),
                         [](const ::testing::TestParamInfo<uint32_t>& info) {
                           return fmt::format("elements{}", info.param);
                         });

TEST_F(AggregatorTest, OtherTrafficPasses) {
  add_job(2);
  Frame arp(64);
  reinterpret_cast<ethhdr*>(arp.data())->h_proto = htons(ETH_P_ARP);
  FrameSpec other_port = data(0, 0, 0);
  other_port.dst_port = wire::kDefaultDataPort + 1;
  Frame tcp = build_frame(data(0, 0, 0));
  ip_of(tcp)->protocol = IPPROTO_TCP;
  // A later fragment's bytes where a UDP header would be are another datagram's data.
  Frame later_fragment = build_frame(data(0, 0, 0));
  ip_of(later_fragment)->frag_off = htons(8);
  Frame not_ipv4 = build_frame(data(0, 0, 0));
  ip_of(not_ipv4)->version = 6;
  for (const Frame& frame : {arp, build_frame(other_port), tcp, later_fragment, not_ipv4})
    EXPECT_EQ(run(frame).verdict, XDP_PASS);
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
}  // namespace xagg::dataplane::bpf_test
