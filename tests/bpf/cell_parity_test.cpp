// The cell rules (docs/protocol.md 3.3-3.4, 10 and 11) exist twice: in the XDP
// program and in C++ (src/control/cell_rules.h: the user-space engine's and the
// worker tests' loopback aggregator's). Every share of each case below goes
// through both, the XDP program by BPF_PROG_TEST_RUN, and they must agree on
// what the share did (the outcome counter), the RESULT's values and its flags,
// so that a rule cannot drift in one of them alone.
#include <string>
#include <vector>

#include "aggregator_fixture.h"
#include "cell_rules.h"

namespace xagg::dataplane::bpf_test {
namespace {

struct Step {
  uint32_t rank;
  uint32_t chunk;
  uint32_t iteration;
  wire::ElemOp op = wire::ElemOp::Sum;
  size_t elements = wire::kChunkElems;  // 16-bit lanes where flags has NARROW
  uint8_t flags = 0;
  bool congestion_experienced = false;
};

struct ParityCase {
  std::string name;
  uint32_t world_size;
  std::vector<Step> steps;
  uint32_t sum_shift = 0;
};

void PrintTo(const ParityCase& parity, std::ostream* out) { *out << parity.name; }

constexpr uint8_t kScatter = XAGG_FLAG_SCATTER;
constexpr uint8_t kOwner = XAGG_FLAG_SCATTER | XAGG_FLAG_OWNER;
constexpr uint8_t kNarrow = XAGG_FLAG_NARROW;
constexpr auto kMax = wire::ElemOp::Max;

// The C++ rules over cells laid out as the user-space engine's: two per chunk, by iteration parity.
class CppCells {
 public:
  CppCells(uint32_t world_size, uint32_t sum_shift)
      : job_{wire::all_ranks_mask(world_size), sum_shift},
        capacity_(wire::cell_capacity(wire::cell_class_for(wire::kChunkElems))),
        cells_(kChunks * 2),
        values_(cells_.size() * capacity_) {}

  // The DATA packet (header and payload) is turned into its RESULT's payload on Completed and Resend.
  control::Outcome merge(std::span<std::byte> packet, bool congestion_experienced, control::CellResult& result) {
    const wire::Decoded decoded = wire::decode_packet(packet);
    if (!decoded.header) throw std::runtime_error(fmt::format("undecodable share: {}", wire::to_string(decoded.error)));
    const size_t cell = size_t{decoded.header->chunk} * 2 + (decoded.header->iteration & 1);
    return control::merge(cells_[cell], std::span(values_).subspan(cell * capacity_, capacity_),
                          {packet.data(), decoded.elements, decoded.narrow()}, *decoded.header, job_,
                          congestion_experienced, result);
  }

 private:
  control::CellJob job_;
  size_t capacity_;
  std::vector<control::Cell> cells_;
  std::vector<int32_t> values_;
};

class CellParity : public AggregatorTest, public ::testing::WithParamInterface<ParityCase> {
 protected:
  Frame frame_of(const Step& step) {
    FrameSpec spec = data(step.rank, step.chunk, step.iteration, step.op, step.elements);
    spec.header.flags = step.flags;
    // 16-bit lanes: the bytes of the first half of the int32 share.
    if (step.flags & XAGG_FLAG_NARROW) spec.payload_bytes = step.elements * sizeof(int16_t);
    Frame frame = build_frame(spec);
    ip_of(frame)->tos = step.congestion_experienced ? XAGG_ECN_CE : XAGG_ECN_ECT0;
    return frame;
  }

  // The one counter of the job that the program bumped for a share.
  static std::optional<xagg_counter> bumped(const CounterRow& before, const CounterRow& after) {
    std::optional<xagg_counter> found;
    for (size_t counter = 0; counter < XAGG_CNT_COUNT; counter++) {
      if (after[counter] == before[counter]) continue;
      if (found || after[counter] != before[counter] + 1) return std::nullopt;
      found = static_cast<xagg_counter>(counter);
    }
    return found;
  }
};

TEST_P(CellParity, XdpProgramAndCppRulesAgreeShareByShare) {
  const ParityCase& parity = GetParam();
  JobSpec job{kJobId, kToken, parity.world_size, kChunks, kBroadcastIp, kResultPort, {}, wire::kChunkElems};
  job.sum_shift = parity.sum_shift;
  for (uint32_t rank = 0; rank < parity.world_size; rank++) job.workers.push_back({rank, worker_ip(rank), kResultPort});
  slot_ = dataplane_->add_job(job);
  CppCells cpp(parity.world_size, parity.sum_shift);

  for (size_t index = 0; index < parity.steps.size(); index++) {
    const Step& step = parity.steps[index];
    SCOPED_TRACE(fmt::format("step {}: rank {}, chunk {}, iteration {}", index, step.rank, step.chunk, step.iteration));
    const Frame frame = frame_of(step);
    const CounterRow before = job_counters();
    RunResult xdp = run(frame);
    const std::optional<xagg_counter> xdp_counter = bumped(before, job_counters());
    ASSERT_TRUE(xdp_counter) << "the program bumped no single outcome counter";

    std::vector<std::byte> packet(frame.size() - kXaggOffset);
    std::memcpy(packet.data(), frame.data() + kXaggOffset, packet.size());
    control::CellResult cpp_result;
    const control::Outcome outcome = cpp.merge(packet, step.congestion_experienced, cpp_result);
    ASSERT_EQ(*xdp_counter, control::counter_of(outcome)) << "the engines disagree on what the share did";

    const bool answered = outcome == control::Outcome::Completed || outcome == control::Outcome::Resend;
    ASSERT_EQ(xdp.verdict == XDP_DROP, !answered) << "verdict " << xdp.verdict;
    if (!answered) continue;
    ASSERT_EQ(xdp.out.size(), frame.size()) << "a RESULT is as long as the share it answers";
    EXPECT_EQ(0, std::memcmp(xdp.out.data() + kPayloadOffset, packet.data() + wire::kHeaderBytes,
                             frame.size() - kPayloadOffset))
        << "the engines' RESULT values differ";
    const xagg_hdr& header = *xagg_of(xdp.out);
    EXPECT_EQ((header.flags & XAGG_FLAG_RESEND) != 0, outcome == control::Outcome::Resend);
    EXPECT_EQ(header.flags & XAGG_FLAG_CE, cpp_result.echo);
    EXPECT_EQ((header.flags & XAGG_FLAG_SCATTER) != 0, cpp_result.scatter);
    if (cpp_result.scatter) EXPECT_EQ(ntohs(header.rank), cpp_result.owner);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CellParity,
    ::testing::Values(
        ParityCase{"SumInAnyOrderThenResend", 3, {{2, 3, 5}, {0, 3, 5}, {1, 3, 5}, {0, 3, 5}}},
        ParityCase{"MaxWithDuplicates", 2, {{0, 0, 0, kMax}, {0, 0, 0, kMax}, {1, 0, 0, kMax}, {1, 0, 0, kMax}}},
        ParityCase{"IterationsShareACellByParity",
                   2,
                   {{0, 1, 2}, {1, 1, 2}, {0, 1, 0}, {0, 1, 3}, {0, 1, 4}, {1, 1, 3}, {1, 1, 2}, {1, 1, 4}, {0, 1, 2}}},
        ParityCase{"OpAndLengthMismatches",
                   3,
                   {{0, 2, 0}, {1, 2, 0, kMax}, {1, 2, 0, wire::ElemOp::Sum, 100}, {2, 2, 0}, {1, 2, 0}}},
        ParityCase{"ShortChunks",
                   2,
                   {{0, 3, 1, wire::ElemOp::Sum, 100},
                    {1, 3, 1, wire::ElemOp::Sum, 100},
                    {0, 3, 1, wire::ElemOp::Sum, 100},
                    {0, 3, 1, wire::ElemOp::Sum, 7}}},
        ParityCase{"CongestionExperiencedIsEchoed",
                   3,
                   {{0, 1, 0},
                    {1, 1, 0, wire::ElemOp::Sum, wire::kChunkElems, 0, true},
                    {2, 1, 0},
                    {0, 1, 0},
                    {0, 1, 2},
                    {1, 1, 2},
                    {2, 1, 2},
                    {1, 1, 2, wire::ElemOp::Sum, wire::kChunkElems, 0, true}}},
        ParityCase{"ScatterNamesItsOwner",
                   3,
                   {{0, 1, 2, wire::ElemOp::Sum, wire::kChunkElems, kScatter},
                    {2, 1, 2, wire::ElemOp::Sum, wire::kChunkElems, kOwner},
                    {1, 1, 2, wire::ElemOp::Sum, wire::kChunkElems, kScatter},
                    {0, 1, 2, wire::ElemOp::Sum, wire::kChunkElems, kScatter}}},
        ParityCase{"ScatterSharesThatDisagree",
                   3,
                   {{0, 1, 0, wire::ElemOp::Sum, wire::kChunkElems, kOwner},
                    {1, 1, 0},
                    {2, 1, 0, wire::ElemOp::Sum, wire::kChunkElems, kOwner},
                    {1, 1, 0, wire::ElemOp::Sum, wire::kChunkElems, kScatter}}},
        ParityCase{"NarrowSumIsRescaled",
                   3,
                   {{0, 2, 5, wire::ElemOp::Sum, wire::kChunkElems, kNarrow},
                    {1, 2, 5, wire::ElemOp::Sum, wire::kChunkElems, kNarrow},
                    {2, 2, 5, wire::ElemOp::Sum, wire::kChunkElems, kNarrow},
                    {1, 2, 5, wire::ElemOp::Sum, wire::kChunkElems, kNarrow}},
                   2},
        ParityCase{"NarrowMaxAndMixedWidths",
                   2,
                   {{0, 0, 1, kMax, 300, kNarrow},
                    {1, 0, 1, kMax},
                    {1, 0, 1, kMax, 301, kNarrow},
                    {1, 0, 1, kMax, 300, kNarrow}},
                   1}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace xagg::dataplane::bpf_test
