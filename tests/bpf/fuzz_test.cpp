// Hostile input: a seeded generator feeds random and mutated frames to the XDP
// aggregator through BPF_PROG_TEST_RUN. A user-space oracle predicts, from the
// frame and the job table alone, where each frame must end (passed to the
// stack, or dropped under one reason, or merged into one job's cells); the
// test checks every verdict, that every drop is counted exactly once under
// that reason, and that a bystander job's cells are never touched.
//
// XAGG_FUZZ_CASES sets the number of frames (CI default 200000; the 1M run is
// documented in docs/reliability.md), XAGG_FUZZ_SEED the generator's seed.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>

#include "aggregator_fixture.h"

namespace xagg::dataplane::bpf_test {
namespace {

constexpr uint32_t kBystanderJob = 9;
constexpr uint64_t kBystanderToken = 0x0badc0ffee0ddf00;
constexpr uint32_t kBystanderRankBase = 20;  // its workers' addresses: worker_ip(20 + rank)
constexpr uint32_t kTargetWorld = 3;
constexpr size_t kCheckEvery = 10000;  // frames between counter comparisons

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  return text ? std::strtoull(text, nullptr, 0) : fallback;
}

// Where a frame must end up; `job` is set from bad_token on.
struct Fate {
  enum Kind { Pass, Drop, Cell } kind = Pass;
  xagg_counter reason = XAGG_CNT_COUNT;  // for Drop
  std::optional<uint32_t> job;
};

struct OracleJob {
  uint64_t token = 0;
  uint32_t chunks = 0;
  std::map<uint32_t, std::pair<uint32_t, uint16_t>> workers;  // rank -> (IPv4, UDP port), network order
};

template <typename T>
T load_at(const Frame& frame, size_t offset) {
  T value;
  std::memcpy(&value, frame.data() + offset, sizeof(T));
  return value;
}

// docs/protocol.md section 3.4, in its order, written from the frame bytes.
Fate predict(const Frame& frame, const std::map<uint32_t, OracleJob>& jobs) {
  auto drop = [](xagg_counter reason, std::optional<uint32_t> job = {}) { return Fate{Fate::Drop, reason, job}; };
  if (frame.size() < kIpOffset || load_at<uint16_t>(frame, 12) != htons(ETH_P_IP)) return {};
  if (frame.size() < kUdpOffset) return {};
  auto ip = load_at<iphdr>(frame, kIpOffset);
  if (ip.version != 4 || ip.protocol != IPPROTO_UDP || (ntohs(ip.frag_off) & 0x1fff) || ip.ihl < 5) return {};
  size_t udp_offset = kIpOffset + ip.ihl * 4u;
  if (frame.size() < udp_offset + sizeof(udphdr)) return {};
  auto udp = load_at<udphdr>(frame, udp_offset);
  if (udp.dest != htons(wire::kDefaultDataPort)) return {};
  if (ip.ihl != 5 || (ntohs(ip.frag_off) & 0x2000)) return drop(XAGG_CNT_MALFORMED);
  const size_t udp_bytes = ntohs(udp.len);
  if (ntohs(ip.tot_len) != sizeof(iphdr) + udp_bytes || udp_bytes < sizeof(udphdr) + XAGG_HDR_BYTES + 2 ||
      udp_bytes > sizeof(udphdr) + XAGG_PACKET_BYTES || udp_bytes % 2 != 0 ||
      frame.size() < kUdpOffset + udp_bytes)
    return drop(XAGG_CNT_MALFORMED);
  auto hdr = load_at<xagg_hdr>(frame, kXaggOffset);
  const bool result = hdr.type == XAGG_MSG_RESULT;  // from a parent, to a leaf job (protocol.md section 9)
  const bool bad_data_flags =
      (hdr.flags & ~XAGG_DATA_FLAGS) || ((hdr.flags & XAGG_FLAG_OWNER) && !(hdr.flags & XAGG_FLAG_SCATTER));
  // int32 elements are whole pairs of 16-bit lanes (protocol.md section 11).
  const bool whole_elements = (hdr.flags & XAGG_FLAG_NARROW) || udp_bytes % 4 == 0;
  if (hdr.magic != htons(XAGG_MAGIC) || (hdr.type != XAGG_MSG_DATA && !result) || (bad_data_flags && !result) ||
      hdr.op >= XAGG_OP_COUNT || (hdr.op == XAGG_OP_OR && !(hdr.flags & XAGG_FLAG_NARROW)) || !whole_elements)
    return drop(XAGG_CNT_MALFORMED);
  if (hdr.version != XAGG_VERSION) return drop(XAGG_CNT_BAD_VERSION);
  if (result) return drop(XAGG_CNT_UNKNOWN_JOB);  // no job here is a leaf
  uint32_t job_id = ntohl(hdr.job_id);
  auto job = jobs.find(job_id);
  if (job == jobs.end()) return drop(XAGG_CNT_UNKNOWN_JOB);
  if (be64toh(hdr.token) != job->second.token) return drop(XAGG_CNT_BAD_TOKEN, job_id);
  auto worker = job->second.workers.find(ntohs(hdr.rank));
  if (worker == job->second.workers.end()) return drop(XAGG_CNT_UNKNOWN_WORKER, job_id);
  if (worker->second != std::pair{ip.saddr, udp.source}) return drop(XAGG_CNT_WRONG_SOURCE, job_id);
  if (ntohl(hdr.chunk) >= job->second.chunks) return drop(XAGG_CNT_OUT_OF_RANGE, job_id);
  return {Fate::Cell, XAGG_CNT_COUNT, job_id};
}

// Outcomes of a frame that reached a cell; any of them is legal for fuzzed input.
constexpr std::array kCellOutcomes{XAGG_CNT_AGGREGATED, XAGG_CNT_COMPLETED,   XAGG_CNT_DUPLICATE,
                                   XAGG_CNT_RESENT,     XAGG_CNT_STALE,       XAGG_CNT_OP_MISMATCH,
                                   XAGG_CNT_LENGTH_MISMATCH, XAGG_CNT_CONTENDED};

// Random and mutated frames; biased towards frames that get far into the checks.
class FrameGenerator {
 public:
  explicit FrameGenerator(uint64_t seed) : random_(seed) {}

  Frame next() {
    switch (pick(10)) {
      case 0: return random_bytes();
      case 1: case 2: return mutate(bystander_frame(), pick(3));
      case 3: case 4: case 5: return with_field_set(target_frame());
      default: return mutate(target_frame(), pick(4));
    }
  }

 private:
  uint32_t pick(uint32_t bound) { return std::uniform_int_distribution<uint32_t>(0, bound - 1)(random_); }
  uint64_t any64() { return random_(); }

  // A well-formed DATA frame of the target job, possibly from an unregistered rank or beyond its chunks.
  Frame target_frame() {
    uint32_t rank = pick(kTargetWorld + 1);
    FrameSpec spec;
    spec.header = {wire::MsgType::Data, kJobId, kToken, pick(8), pick(kChunks + 2), static_cast<uint16_t>(rank),
                   pick(2) ? wire::ElemOp::Sum : wire::ElemOp::Max, 0};
    spec.values.resize(pick(4) ? wire::kChunkElems : 1 + pick(wire::kChunkElems));  // some short chunks
    for (auto& value : spec.values) value = static_cast<int32_t>(any64());
    spec.src_ip = worker_ip(rank);
    spec.src_mac = worker_mac(rank);
    return build_frame(spec);
  }

  // Names the bystander job with a guessed token: must never reach its cells.
  Frame bystander_frame() {
    FrameSpec spec;
    uint64_t token = any64();
    if (token == kBystanderToken) token ^= 1;
    uint32_t rank = pick(2);
    spec.header = {wire::MsgType::Data, kBystanderJob, token, pick(2), pick(kChunks), static_cast<uint16_t>(rank),
                   wire::ElemOp::Sum, 0};
    spec.values = share(rank, 7);
    spec.src_ip = worker_ip(kBystanderRankBase + rank);
    return build_frame(spec);
  }

  Frame random_bytes() {
    Frame frame(sizeof(ethhdr) + pick(kFrameBytes + 64 - sizeof(ethhdr)));
    for (auto& byte : frame) byte = static_cast<uint8_t>(random_());
    if (pick(2)) reinterpret_cast<ethhdr*>(frame.data())->h_proto = htons(ETH_P_IP);
    return frame;
  }

  Frame mutate(Frame frame, uint32_t mutations) {
    for (uint32_t i = 0; i < mutations; ++i) {
      switch (pick(4)) {
        case 0:  // a bit in the headers
          frame[pick(static_cast<uint32_t>(std::min(frame.size(), kPayloadOffset)))] ^= static_cast<uint8_t>(1u << pick(8));
          break;
        case 1:  // a byte anywhere
          frame[pick(static_cast<uint32_t>(frame.size()))] = static_cast<uint8_t>(random_());
          break;
        case 2:  // truncated or extended
          frame.resize(std::max<size_t>(sizeof(ethhdr), frame.size() + pick(129) - 64));
          break;
        default:  // a header field at a boundary value
          frame = with_field_set(std::move(frame));
      }
    }
    return frame;
  }

  // One header field set to a boundary or random value.
  Frame with_field_set(Frame frame) {
    struct Field {
      size_t offset;
      size_t bytes;
    };
    static constexpr std::array kFields{
        Field{12, 2},                                   // EtherType
        Field{kIpOffset, 1},                            // version and IHL
        Field{kIpOffset + 2, 2},                        // total length
        Field{kIpOffset + 6, 2},                        // fragment offset and flags
        Field{kIpOffset + 9, 1},                        // protocol
        Field{kIpOffset + 12, 4},                       // source address
        Field{kUdpOffset, 2},                           // source port
        Field{kUdpOffset + 2, 2},                       // destination port
        Field{kUdpOffset + 4, 2},                       // UDP length
        Field{kXaggOffset, 2},                          // magic
        Field{kXaggOffset + 2, 1},                      // version
        Field{kXaggOffset + 3, 1},                      // type
        Field{kXaggOffset + 4, 4},                      // job
        Field{kXaggOffset + 8, 8},                      // token
        Field{kXaggOffset + 16, 4},                     // iteration
        Field{kXaggOffset + 20, 4},                     // chunk
        Field{kXaggOffset + 24, 2},                     // rank
        Field{kXaggOffset + 26, 1},                     // op
        Field{kXaggOffset + 27, 1},                     // flags
        Field{kXaggOffset + 28, 4},                     // total
    };
    const Field& field = kFields[pick(kFields.size())];
    if (frame.size() < field.offset + field.bytes) return frame;
    uint64_t value;
    switch (pick(4)) {
      case 0: value = 0; break;
      case 1: value = 1; break;
      case 2: value = ~uint64_t{0}; break;
      default: value = any64();
    }
    for (size_t i = 0; i < field.bytes; ++i) frame[field.offset + i] = static_cast<uint8_t>(value >> (8 * i));
    return frame;
  }

  std::mt19937_64 random_;
};

class AggregatorFuzzTest : public AggregatorTest {
 protected:
  void SetUp() override {
    AggregatorTest::SetUp();
    add_job(kTargetWorld);
    JobSpec bystander{kBystanderJob, kBystanderToken, 2, kChunks, kBroadcastIp, kResultPort, {}};
    for (uint32_t rank = 0; rank < 2; ++rank)
      bystander.workers.push_back({rank, worker_ip(kBystanderRankBase + rank), kResultPort});
    dataplane_->add_job(bystander);
    for (const JobSpec& job : {JobSpec{kJobId, kToken, kTargetWorld, kChunks, {}, {}, {}}, bystander}) {
      OracleJob& entry = oracle_jobs_[job.job_id];
      entry.token = job.token;
      entry.chunks = job.chunks;
    }
    for (uint32_t rank = 0; rank < kTargetWorld; ++rank)
      oracle_jobs_[kJobId].workers[rank] = {worker_ip(rank).s_addr, htons(kResultPort)};
    for (uint32_t rank = 0; rank < 2; ++rank)
      oracle_jobs_[kBystanderJob].workers[rank] = {worker_ip(kBystanderRankBase + rank).s_addr, htons(kResultPort)};
    // Half of every bystander cell (both parities) holds rank 0's share.
    for (uint32_t iteration : {0u, 1u})
      for (uint32_t chunk = 0; chunk < kChunks; ++chunk) ASSERT_EQ(run(bystander_data(0, chunk, iteration)).verdict, XDP_DROP);
  }

  static FrameSpec bystander_data(uint32_t rank, uint32_t chunk, uint32_t iteration) {
    FrameSpec spec = data(rank, chunk, iteration);
    spec.header.job_id = kBystanderJob;
    spec.header.token = kBystanderToken;
    spec.src_ip = worker_ip(kBystanderRankBase + rank);
    return spec;
  }

  // The counters must equal exactly what the oracle predicted for every frame so far.
  void expect_counters_match(size_t frames_so_far) {
    SCOPED_TRACE(fmt::format("after {} frames", frames_so_far));
    CounterRow no_job = no_job_counters();
    for (int counter = 0; counter < XAGG_CNT_COUNT; ++counter) {
      auto reason = static_cast<xagg_counter>(counter);
      EXPECT_EQ(no_job[counter], predicted_[std::nullopt][reason]) << "no-job row, " << counter_name(reason);
    }
    for (uint32_t job_id : {kJobId, kBystanderJob}) {
      CounterRow row = dataplane_->job_counters(job_id);
      uint64_t cell_outcomes = 0;
      for (xagg_counter outcome : kCellOutcomes) cell_outcomes += row[outcome];
      EXPECT_EQ(cell_outcomes, predicted_cells_[job_id]) << "job " << job_id << ": frames that reached a cell";
      for (int counter = 0; counter < XAGG_CNT_COUNT; ++counter) {
        auto reason = static_cast<xagg_counter>(counter);
        if (std::ranges::find(kCellOutcomes, reason) != kCellOutcomes.end()) continue;
        EXPECT_EQ(row[counter], predicted_[job_id][reason]) << "job " << job_id << ", " << counter_name(reason);
      }
    }
  }

  std::map<uint32_t, OracleJob> oracle_jobs_;
  std::map<std::optional<uint32_t>, std::map<xagg_counter, uint64_t>> predicted_;  // row -> drop reason -> frames
  std::map<uint32_t, uint64_t> predicted_cells_{{kBystanderJob, 2 * kChunks}};    // the preloaded shares
};

TEST_F(AggregatorFuzzTest, RandomAndMutatedFramesAreClassifiedCountedAndContained) {
  const uint64_t cases = env_or("XAGG_FUZZ_CASES", 200000);
  const uint64_t seed = env_or("XAGG_FUZZ_SEED", 0x5841676721);
  RecordProperty("cases", std::to_string(cases));
  RecordProperty("seed", std::to_string(seed));
  FrameGenerator generator(seed);
  std::map<Fate::Kind, uint64_t> fates;
  uint64_t wrong_verdicts = 0;
  for (uint64_t i = 1; i <= cases; ++i) {
    Frame frame = generator.next();
    Fate fate = predict(frame, oracle_jobs_);
    uint32_t verdict = run(frame).verdict;
    fates[fate.kind]++;
    // A completed reduce-scatter chunk goes to the tc fan-out (XDP_PASS with the mark).
    const bool scattered =
        fate.kind == Fate::Cell && (load_at<xagg_hdr>(frame, kXaggOffset).flags & XAGG_FLAG_SCATTER) != 0;
    bool expected = fate.kind == Fate::Pass   ? verdict == XDP_PASS
                    : fate.kind == Fate::Drop ? verdict == XDP_DROP
                                              : verdict == XDP_DROP || verdict == XDP_TX ||
                                                    (scattered && verdict == XDP_PASS);
    if (!expected && ++wrong_verdicts <= 10)
      ADD_FAILURE() << fmt::format("frame {} ({} bytes): verdict {}, predicted kind {} reason {}", i, frame.size(),
                                   verdict, static_cast<int>(fate.kind), static_cast<int>(fate.reason));
    if (fate.kind == Fate::Drop) predicted_[fate.job][fate.reason]++;
    if (fate.kind == Fate::Cell) predicted_cells_[*fate.job]++;
    if (i % kCheckEvery == 0 || i == cases) expect_counters_match(i);
    if (HasFailure()) break;
  }
  EXPECT_EQ(wrong_verdicts, 0u);
  // Every class must have been exercised for the run to mean anything.
  EXPECT_GT(fates[Fate::Pass], cases / 100);
  EXPECT_GT(fates[Fate::Drop], cases / 10);
  EXPECT_GT(fates[Fate::Cell], cases / 100);
  std::cout << fmt::format("{} frames (seed {:#x}): {} passed, {} dropped before any cell, {} reached a cell\n", cases,
                           seed, fates[Fate::Pass], fates[Fate::Drop], fates[Fate::Cell]);

  // The bystander's cells still hold exactly rank 0's shares: rank 1 completes them to the exact sums.
  for (uint32_t iteration : {0u, 1u})
    for (uint32_t chunk = 0; chunk < kChunks; ++chunk) {
      RunResult result = run(bystander_data(1, chunk, iteration));
      ASSERT_EQ(result.verdict, XDP_TX) << "bystander chunk " << chunk << " iteration " << iteration;
      EXPECT_EQ(payload_of(result.out), sum_of({share(0, iteration), share(1, iteration)}))
          << "bystander chunk " << chunk << " iteration " << iteration;
    }
}

}  // namespace
}  // namespace xagg::dataplane::bpf_test
