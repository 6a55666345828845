// A leaf job of a two-level job through BPF_PROG_TEST_RUN (protocol.md
// section 9): its completed chunk leaves as the leaf's DATA share for the
// parent, the parent's RESULT comes back to the ranks, a repeated share goes
// up again and the parent's resent RESULT reaches the rank that asked; a
// RESULT that is not the parent's is dropped and counted.
#include "aggregator_fixture.h"

namespace xagg::dataplane::bpf_test {
namespace {

constexpr uint32_t kParentJob = 99;
constexpr uint64_t kParentToken = 0x0123456789abcdef;
constexpr uint32_t kParentRank = 2;
constexpr uint16_t kParentPort = 9987;
inline const in_addr kParentIp{inet_addr("198.18.0.9")};
constexpr std::array<uint8_t, ETH_ALEN> kNextHopMac{0x02, 0, 0, 0, 0, 0x99};

class LeafTest : public AggregatorTest {
 protected:
  void SetUp() override {
    AggregatorTest::SetUp();
    JobSpec job{kJobId, kToken, 2, kChunks, kBroadcastIp, kResultPort, {}, wire::kChunkElems,
                wire::ResultMode::Broadcast};
    job.uplink = UplinkSpec{kParentIp, kParentPort, kParentJob, kParentToken, kParentRank, kAggregatorIp,
                            kAggregatorMac, kNextHopMac};
    for (uint32_t rank = 0; rank < 2; rank++) job.workers.push_back({rank, worker_ip(rank), kResultPort});
    slot_ = dataplane_->add_job(job);
  }

  // The parent's RESULT of `chunk`, holding `values`.
  static FrameSpec from_parent(uint32_t chunk, uint32_t iteration, const Values& values, uint8_t flags = 0) {
    FrameSpec spec;
    spec.header = {wire::MsgType::Result, kParentJob, kParentToken, iteration, chunk, 0, wire::ElemOp::Sum, flags};
    spec.values = values;
    spec.src_ip = kParentIp;
    spec.src_port = kParentPort;
    spec.src_mac = kNextHopMac;
    return spec;
  }

  // The leaf's share, sent up: DATA of the parent's job from this leaf.
  static void expect_sent_up(RunResult& result, uint32_t chunk, const Values& expected) {
    ASSERT_EQ(result.verdict, XDP_TX);
    auto* eth = reinterpret_cast<ethhdr*>(result.out.data());
    EXPECT_EQ(0, std::memcmp(eth->h_dest, kNextHopMac.data(), ETH_ALEN));
    EXPECT_EQ(0, std::memcmp(eth->h_source, kAggregatorMac.data(), ETH_ALEN));
    iphdr* ip = ip_of(result.out);
    EXPECT_EQ(ip->saddr, kAggregatorIp.s_addr);
    EXPECT_EQ(ip->daddr, kParentIp.s_addr);
    EXPECT_EQ(ip->tos & XAGG_ECN_MASK, XAGG_ECN_ECT0);
    EXPECT_TRUE(ipv4_checksum_valid(result.out));
    auto* udp = reinterpret_cast<udphdr*>(result.out.data() + kUdpOffset);
    EXPECT_EQ(ntohs(udp->source), wire::kDefaultDataPort);
    EXPECT_EQ(ntohs(udp->dest), kParentPort);
    auto decoded = wire::decode_packet(std::as_bytes(std::span(result.out).subspan(kXaggOffset)));
    ASSERT_TRUE(decoded.header) << wire::to_string(decoded.error);
    EXPECT_EQ(decoded.header->type, wire::MsgType::Data);
    EXPECT_EQ(decoded.header->job_id, kParentJob);
    EXPECT_EQ(decoded.header->token, kParentToken);
    EXPECT_EQ(decoded.header->rank, kParentRank);
    EXPECT_EQ(decoded.header->chunk, chunk);
    EXPECT_EQ(decoded.header->flags, 0);
    EXPECT_EQ(payload_of(result.out), expected);
  }
};

TEST_F(LeafTest, CompletedChunkGoesUpAsTheLeafsShare) {
  EXPECT_EQ(run(data(0, 1, 0)).verdict, XDP_DROP);
  RunResult up = run(data(1, 1, 0));
  expect_sent_up(up, 1, sum_of({share(0, 0), share(1, 0)}));
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 1}, {XAGG_CNT_COMPLETED, 1}, {XAGG_CNT_SENT_UP, 1}}));
}

TEST_F(LeafTest, ParentsResultReachesTheRanksAsTheLeafsOwn) {
  const Values total = share(5, 0);
  RunResult down = run(from_parent(1, 0, total, XAGG_FLAG_CE));
  ASSERT_EQ(down.verdict, XDP_TX);
  auto* eth = reinterpret_cast<ethhdr*>(down.out.data());
  EXPECT_EQ(std::vector<uint8_t>(eth->h_dest, eth->h_dest + ETH_ALEN), std::vector<uint8_t>(ETH_ALEN, 0xff));
  EXPECT_EQ(0, std::memcmp(eth->h_source, kAggregatorMac.data(), ETH_ALEN));
  expect_result_header(down, 1, 0, kBroadcastIp, kResultPort, XAGG_FLAG_CE, total);
  auto decoded = wire::decode_packet(std::as_bytes(std::span(down.out).subspan(kXaggOffset)));
  ASSERT_TRUE(decoded.header);
  EXPECT_EQ(decoded.header->token, kToken);
  EXPECT_EQ(decoded.header->rank, XAGG_NO_RANK);
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_RELAYED_DOWN, 1}}));
}

TEST_F(LeafTest, ResultNotFromTheParentIsDroppedAndCounted) {
  FrameSpec forged = from_parent(1, 0, share(5, 0));
  forged.header.token ^= 1;
  expect_dropped(forged);
  forged = from_parent(1, 0, share(5, 0));
  forged.src_port = kParentPort + 1;
  expect_dropped(forged);
  forged = from_parent(kChunks, 0, share(5, 0));
  expect_dropped(forged);
  EXPECT_EQ(job_counters(),
            counters_with({{XAGG_CNT_BAD_TOKEN, 1}, {XAGG_CNT_WRONG_SOURCE, 1}, {XAGG_CNT_OUT_OF_RANGE, 1}}));
  forged = from_parent(1, 0, share(5, 0));
  forged.src_ip = worker_ip(0);  // a rank posing as the parent
  expect_dropped(forged);
  EXPECT_EQ(no_job_counters(), counters_with({{XAGG_CNT_UNKNOWN_JOB, 1}}));
}

// A rank that lost the result asks again: the leaf sends its share up again,
// and the parent's resend goes to that rank only, as a one-level resend would.
TEST_F(LeafTest, RepeatedShareGoesUpAgainAndTheResendReachesTheAsker) {
  run(data(0, 2, 0));
  run(data(1, 2, 0));
  RunResult again = run(data(1, 2, 0));
  const Values leaf_sum = sum_of({share(0, 0), share(1, 0)});
  expect_sent_up(again, 2, leaf_sum);
  const Values total = share(6, 0);
  RunResult resend = run(from_parent(2, 0, total, XAGG_FLAG_RESEND));
  ASSERT_EQ(resend.verdict, XDP_TX);
  auto* eth = reinterpret_cast<ethhdr*>(resend.out.data());
  EXPECT_EQ(0, std::memcmp(eth->h_dest, worker_mac(1).data(), ETH_ALEN));
  expect_result_header(resend, 2, 0, worker_ip(1), kResultPort, XAGG_FLAG_RESEND, total);
  // Nobody asked since: a further resend goes to every rank.
  RunResult unasked = run(from_parent(2, 0, total, XAGG_FLAG_RESEND));
  expect_broadcast_result(unasked, 2, 0, total);
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 1},
                                           {XAGG_CNT_COMPLETED, 1},
                                           {XAGG_CNT_RESENT, 1},
                                           {XAGG_CNT_SENT_UP, 2},
                                           {XAGG_CNT_RELAYED_DOWN, 2}}));
}

}  // namespace
}  // namespace xagg::dataplane::bpf_test
