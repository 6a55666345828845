// The XDP aggregator's 16-bit wire (docs/protocol.md section 11) through
// BPF_PROG_TEST_RUN: 16-bit lanes summed in 32-bit cells, SUM results divided
// by 2^sum_shift with ties to even, MAX and OR exact, lengths and mixing with
// int32 shares refused and counted.
#include <cfenv>
#include <cmath>

#include "aggregator_fixture.h"

namespace xagg::dataplane::bpf_test {
namespace {

using Lanes = std::vector<int16_t>;

// A rank's lanes: every value of int16 reached over the ranks, both extremes included.
Lanes lanes_of(uint32_t rank, size_t count) {
  Lanes lanes(count);
  for (size_t i = 0; i < count; i++) lanes[i] = static_cast<int16_t>((i * 2654435761u + rank * 40503u) >> 7);
  lanes[0] = INT16_MAX;
  lanes[1] = INT16_MIN;
  return lanes;
}

// sum / 2^shift rounded to nearest, ties to even, in double (exact here): an
// implementation of its own, not wire::rescale_sum's integer one.
int32_t rounded_quotient(int64_t sum, uint32_t shift) {
  EXPECT_EQ(std::fegetround(), FE_TONEAREST);
  return static_cast<int32_t>(std::nearbyint(std::ldexp(static_cast<double>(sum), -static_cast<int>(shift))));
}

class NarrowTest : public AggregatorTest {
 protected:
  void add_narrow_job(uint32_t world_size, uint32_t chunk_elements, uint32_t sum_shift) {
    JobSpec job{kJobId, kToken, world_size, kChunks, kBroadcastIp, kResultPort, {}, chunk_elements};
    job.sum_shift = sum_shift;
    for (uint32_t rank = 0; rank < world_size; rank++) job.workers.push_back({rank, worker_ip(rank), kResultPort});
    slot_ = dataplane_->add_job(job);
  }

  static FrameSpec narrow_data(uint32_t rank, uint32_t chunk, uint32_t iteration, const Lanes& lanes,
                               wire::ElemOp op = wire::ElemOp::Sum) {
    FrameSpec spec = data(rank, chunk, iteration, op, 0);
    spec.header.flags = XAGG_FLAG_NARROW;
    spec.values.resize((lanes.size() + 1) / 2);
    std::memcpy(spec.values.data(), lanes.data(), lanes.size() * sizeof(int16_t));
    spec.payload_bytes = lanes.size() * sizeof(int16_t);
    return spec;
  }

  static Lanes result_lanes(const RunResult& result) {
    Lanes lanes((result.out.size() - kPayloadOffset) / sizeof(int16_t));
    std::memcpy(lanes.data(), result.out.data() + kPayloadOffset, lanes.size() * sizeof(int16_t));
    return lanes;
  }

  // Every rank's lanes in; the RESULT of the last one, checked as a broadcast with flag NARROW.
  Lanes complete(const std::vector<Lanes>& shares, wire::ElemOp op = wire::ElemOp::Sum) {
    for (uint32_t rank = 0; rank + 1 < shares.size(); rank++) expect_dropped(narrow_data(rank, 2, 5, shares[rank], op));
    const auto last = static_cast<uint32_t>(shares.size() - 1);
    RunResult result = run(narrow_data(last, 2, 5, shares[last], op));
    EXPECT_EQ(result.verdict, XDP_TX);
    EXPECT_EQ(result.out.size(), kPayloadOffset + shares[0].size() * sizeof(int16_t));
    auto decoded = wire::decode_packet(std::as_bytes(std::span(result.out).subspan(kXaggOffset)));
    EXPECT_TRUE(decoded.header);
    if (decoded.header) {
      EXPECT_EQ(decoded.header->type, wire::MsgType::Result);
      EXPECT_EQ(decoded.header->flags, XAGG_FLAG_NARROW);
      EXPECT_EQ(decoded.elements, shares[0].size());
    }
    return result_lanes(result);
  }

  void expect_rescaled_sums(uint32_t world_size, uint32_t chunk_elements, uint32_t sum_shift, size_t lanes) {
    add_narrow_job(world_size, chunk_elements, sum_shift);
    std::vector<Lanes> shares;
    for (uint32_t rank = 0; rank < world_size; rank++) shares.push_back(lanes_of(rank, lanes));
    const Lanes result = complete(shares);
    ASSERT_EQ(result.size(), lanes);
    for (size_t i = 0; i < lanes; i++) {
      int64_t sum = 0;
      for (const Lanes& share : shares) sum += share[i];
      ASSERT_EQ(result[i], rounded_quotient(sum, sum_shift)) << "lane " << i << " of sum " << sum;
    }
    EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, world_size - 1}, {XAGG_CNT_COMPLETED, 1}}));
  }
};

// Jumbo links: 4096 lanes in one packet, the cells of the narrow jumbo class.
TEST_F(NarrowTest, FourRanksOfAJumboChunkSumAndRescale) {
  expect_rescaled_sums(4, wire::chunk_elements_for(9000, wire::kNarrowBits), 2, wire::kMaxChunkElems);
}

// MTU 1500: 720 lanes, twice the 32-bit wire's 360; an odd count of lanes is whole lanes.
TEST_F(NarrowTest, ThreeRanksAtMtu1500AndAnOddLaneCount) {
  ASSERT_EQ(wire::chunk_elements_for(1500, wire::kNarrowBits), 720u);
  expect_rescaled_sums(3, 720, 2, 719);
}

// Every tie rounds to even, on both signs, whatever the shift.
TEST_F(NarrowTest, TiesRoundToEvenOnBothSigns) {
  add_narrow_job(2, 1024, 2);
  // Sums 2, 6, -2, -6, 10, 1, 3, -1, -3 over 4: 0.5, 1.5, -0.5, -1.5, 2.5, 0.25, 0.75, -0.25, -0.75.
  const Lanes a{1, 3, -1, -3, 5, 1, 2, 0, -2}, b{1, 3, -1, -3, 5, 0, 1, -1, -1};
  EXPECT_EQ(complete({a, b}), (Lanes{0, 2, 0, -2, 2, 0, 1, 0, -1}));
}

// 64 ranks at int16's extremes: the 32-bit cells hold the sums, which fit 16 bits again after a shift of 6.
TEST_F(NarrowTest, SixtyFourRanksAtTheExtremesNeitherOverflowNorClip) {
  add_narrow_job(64, 384, 6);
  std::vector<Lanes> shares(64);
  for (uint32_t rank = 0; rank < 64; rank++) shares[rank] = {INT16_MAX, INT16_MIN, static_cast<int16_t>(rank % 2 ? 1 : 0)};
  EXPECT_EQ(complete(shares), (Lanes{INT16_MAX, INT16_MIN, 0}));  // 32 / 64 = 0.5 ties to 0
}

TEST_F(NarrowTest, MaxAndOrAreExactWithoutRescaling) {
  add_narrow_job(3, 384, 2);
  const Lanes a{-5, 7, INT16_MIN}, b{3, -7, -1}, c{-32000, 0, INT16_MIN};
  EXPECT_EQ(complete({a, b, c}, wire::ElemOp::Max), (Lanes{3, 7, -1}));
  const Lanes x{1, 8, 0}, y{2, 8, 16}, z{4, 0, 0};
  for (uint32_t rank = 0; rank < 2; rank++) expect_dropped(narrow_data(rank, 3, 5, rank ? y : x, wire::ElemOp::Or));
  RunResult result = run(narrow_data(2, 3, 5, z, wire::ElemOp::Or));
  ASSERT_EQ(result.verdict, XDP_TX);
  EXPECT_EQ(result_lanes(result), (Lanes{7, 8, 16}));
}

// A resend answers with the same rescaled lanes.
TEST_F(NarrowTest, ResendCarriesTheRescaledResult) {
  add_narrow_job(2, 1024, 1);
  const Lanes a{3, -3, 100}, b{0, 0, 101};  // 1.5 -> 2, -1.5 -> -2, 100.5 -> 100
  EXPECT_EQ(complete({a, b}), (Lanes{2, -2, 100}));
  RunResult resend = run(narrow_data(0, 2, 5, a));
  ASSERT_EQ(resend.verdict, XDP_TX);
  EXPECT_EQ(xagg_of(resend.out)->flags, XAGG_FLAG_NARROW | XAGG_FLAG_RESEND);
  EXPECT_EQ(result_lanes(resend), (Lanes{2, -2, 100}));
}

// 16-bit and int32 shares never add in one cell; over-long and odd payloads are refused.
TEST_F(NarrowTest, WidthMixesAndBadLengthsAreRefusedAndCounted) {
  add_narrow_job(2, 384, 1);
  expect_dropped(narrow_data(0, 1, 0, Lanes(8, 1)));
  expect_dropped(data(1, 1, 0, wire::ElemOp::Sum, 4));  // the same 16 bytes as int32: another width
  expect_dropped(narrow_data(1, 1, 0, Lanes(385, 1)));  // longer than the job's cells
  FrameSpec odd = narrow_data(1, 1, 0, Lanes(8, 1));
  odd.payload_bytes = 15;
  expect_dropped(odd);
  FrameSpec huge = narrow_data(1, 1, 0, Lanes(wire::kMaxChunkElems + 1, 1));
  expect_dropped(huge);
  EXPECT_EQ(job_counters(), counters_with({{XAGG_CNT_AGGREGATED, 1},
                                           {XAGG_CNT_OP_MISMATCH, 1},
                                           {XAGG_CNT_LENGTH_MISMATCH, 1}}));
  EXPECT_EQ(no_job_counters(), counters_with({{XAGG_CNT_MALFORMED, 2}}));
}

}  // namespace
}  // namespace xagg::dataplane::bpf_test
