// The registry's memory accounting for jobs of any MTU, with the user-space
// engine behind it (on a loopback port; no packets are sent): a job reserves
// the cells of its chunk size's class, a quota that fits only those cells
// admits it, and a rank that lowers the job's MTU before start re-sizes the
// reservation and the cells the engine creates.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include "engine.h"
#include "job_registry.h"
#include "wire.h"

namespace xagg::control {
namespace {

constexpr uint64_t kElements = 1'000'000;

// Keeps what the registry sent to every connection.
class RecordingOutbox final : public Outbox {
 public:
  void send(ConnectionId connection, const Message& message) override { sent[connection].push_back(message); }
  void close_after_sending(ConnectionId connection) override { closed.push_back(connection); }
  std::string describe(ConnectionId connection) const override { return fmt::format("connection {}", connection); }

  template <class T>
  const T* last(ConnectionId connection) const {
    auto it = sent.find(connection);
    return it == sent.end() || it->second.empty() ? nullptr : std::get_if<T>(&it->second.back());
  }

  std::map<ConnectionId, std::vector<Message>> sent;
  std::vector<ConnectionId> closed;
};

// Records the parent joins of leaf jobs.
struct RecordingParents final : Parents {
  void join(uint32_t job_id, const sockaddr_in&, const JoinRequest& request) override {
    joins.emplace_back(job_id, request);
  }
  void end(uint32_t job_id, bool completed) override { ends.emplace_back(job_id, completed); }
  std::vector<std::pair<uint32_t, JoinRequest>> joins;
  std::vector<std::pair<uint32_t, bool>> ends;
};

uint32_t chunks_at(uint32_t mtu) { return wire::layout_for(kElements, wire::chunk_elements_for(mtu)).total(); }
uint64_t reservation_at(uint32_t mtu) { return wire::cell_bytes(chunks_at(mtu), wire::chunk_elements_for(mtu)); }

class JobRegistryMemoryTest : public ::testing::Test {
 protected:
  // A registry whose jobs may hold `quota` bytes of cells.
  void open(uint64_t quota) {
    RegistrySettings settings;
    settings.memory_quota = quota;
    settings.result_port_base = 20000;
    settings.data_port = wire::kDefaultDataPort;
    registry_ = std::make_unique<JobRegistry>(*engine_, settings, outbox_, parents_);
  }

  void join(ConnectionId connection, uint32_t rank, uint32_t world_size, uint32_t mtu) {
    JoinRequest request;
    request.job_id = 1;
    request.rank = rank;
    request.world_size = world_size;
    request.elements = kElements;
    request.mtu = mtu;
    registry_->on_join(connection, in_addr{htonl(0x7f000001)}, request);
  }

  uint64_t used() const { return quota_ - registry_->free_memory(); }

  std::unique_ptr<Engine> engine_ = make_userspace_engine(0, 1);
  RecordingOutbox outbox_;
  RecordingParents parents_;
  uint64_t quota_ = uint64_t{1} << 30;
  std::unique_ptr<JobRegistry> registry_;
};

TEST(CellAccounting, ClassesHoldTheChunksOfTheCommonMtusClosely) {
  EXPECT_EQ(wire::cell_class_for(wire::chunk_elements_for(wire::kMinLinkMtu)), XAGG_CELL_CLASS_SMALL);
  EXPECT_EQ(wire::cell_class_for(wire::chunk_elements_for(1500)), XAGG_CELL_CLASS_SMALL);
  EXPECT_EQ(wire::cell_class_for(384), XAGG_CELL_CLASS_SMALL);
  EXPECT_EQ(wire::cell_class_for(392), XAGG_CELL_CLASS_MEDIUM);
  EXPECT_EQ(wire::cell_class_for(wire::chunk_elements_for(4000)), XAGG_CELL_CLASS_MEDIUM);
  EXPECT_EQ(wire::cell_class_for(1032), XAGG_CELL_CLASS_LARGE);
  EXPECT_EQ(wire::cell_class_for(wire::chunk_elements_for(9000)), XAGG_CELL_CLASS_LARGE);
  EXPECT_EQ(wire::cell_capacity(XAGG_CELL_CLASS_SMALL), 384u);
  EXPECT_EQ(wire::cell_capacity(XAGG_CELL_CLASS_MEDIUM), 1024u);
  EXPECT_EQ(wire::cell_capacity(XAGG_CELL_CLASS_LARGE), wire::kChunkElems);
  // The 16-bit wire's chunks (twice the elements) in int32 cells: MTU 1500 medium, jumbo the largest class.
  EXPECT_EQ(wire::cell_class_for(wire::chunk_elements_for(1500, wire::kNarrowBits)), XAGG_CELL_CLASS_MEDIUM);
  EXPECT_EQ(wire::cell_class_for(wire::chunk_elements_for(9000, wire::kNarrowBits)), XAGG_CELL_CLASS_NARROW_JUMBO);
  EXPECT_EQ(wire::cell_capacity(XAGG_CELL_CLASS_NARROW_JUMBO), wire::kMaxChunkElems);
  EXPECT_THROW(wire::cell_class_for(0), std::invalid_argument);
  EXPECT_THROW(wire::cell_class_for(wire::kMaxChunkElems + 1), std::invalid_argument);
}

TEST(CellAccounting, CountsTwoCellsOfTheClassPerChunk) {
  const uint64_t header = offsetof(xagg_chunk, value);
  EXPECT_EQ(wire::cell_bytes(10, 360), 2 * 10 * (header + 384 * 4));
  EXPECT_EQ(wire::cell_bytes(10, 984), 2 * 10 * (header + 1024 * 4));
  EXPECT_EQ(wire::cell_bytes(10, 2048), 2 * 10 * (header + 2048 * 4));
  EXPECT_EQ(wire::cell_bytes(10, 4096), 2 * 10 * sizeof(xagg_chunk));  // the 16-bit wire's jumbo chunks
  // A chunk's cells at MTU 1500 take about 360/2048 of a jumbo chunk's, so the
  // same job takes about the same memory at either MTU, not 2048/360 times more.
  const double per_chunk = static_cast<double>(wire::cell_bytes(1, 360)) / static_cast<double>(wire::cell_bytes(1, 2048));
  EXPECT_NEAR(per_chunk, 360.0 / 2048.0, 0.02);
  const double per_job = static_cast<double>(reservation_at(1500)) / static_cast<double>(reservation_at(9000));
  EXPECT_GT(per_job, 1.0);
  EXPECT_LT(per_job, 1.15);
}

TEST_F(JobRegistryMemoryTest, JobReservesTheCellsOfItsChunkSize) {
  for (uint32_t mtu : {1500u, 4000u, 9000u}) {
    SCOPED_TRACE(mtu);
    open(quota_);
    join(mtu, 0, 1, mtu);
    const Start* start = outbox_.last<Start>(mtu);
    ASSERT_NE(start, nullptr) << "the job did not start";
    EXPECT_EQ(start->chunk_elements, wire::chunk_elements_for(mtu));
    EXPECT_EQ(start->chunks, chunks_at(mtu));
    EXPECT_EQ(used(), reservation_at(mtu));
    // The engine holds every chunk the job was given.
    EXPECT_NO_THROW(engine_->cell_state(1, chunks_at(mtu) - 1, 0));
    registry_.reset();  // removes the job from the engine
  }
}

TEST_F(JobRegistryMemoryTest, QuotaThatFitsOnlySmallCellsAdmitsTheJob) {
  quota_ = reservation_at(1500);
  // Jumbo-sized cells for the job's chunks at MTU 1500 would need 5 times more.
  ASSERT_LT(quota_, 2 * uint64_t{chunks_at(1500)} * sizeof(xagg_chunk) / 5);
  open(quota_);
  join(1, 0, 1, 1500);
  ASSERT_NE(outbox_.last<Start>(1), nullptr) << "the job was refused";
  EXPECT_EQ(registry_->free_memory(), 0u);
}

TEST_F(JobRegistryMemoryTest, QuotaBelowTheSmallCellsRefusesTheJobSayingWhy) {
  quota_ = reservation_at(1500) - 1;
  open(quota_);
  join(1, 0, 1, 1500);
  const Error* error = outbox_.last<Error>(1);
  ASSERT_NE(error, nullptr);
  EXPECT_NE(error->message.find(fmt::format("needs {} bytes", reservation_at(1500))), std::string::npos)
      << error->message;
  EXPECT_NE(error->message.find("of 360 elements for MTU 1500"), std::string::npos) << error->message;
  EXPECT_EQ(used(), 0u);
}

TEST_F(JobRegistryMemoryTest, RankLoweringTheMtuBeforeStartResizesTheReservation) {
  open(quota_);
  join(1, 0, 2, 9000);
  EXPECT_EQ(used(), reservation_at(9000));
  join(2, 1, 2, 1500);
  const Start* start = outbox_.last<Start>(2);
  ASSERT_NE(start, nullptr) << "the job did not start";
  EXPECT_EQ(start->chunk_elements, 360u);
  EXPECT_EQ(used(), reservation_at(1500));
  EXPECT_NO_THROW(engine_->cell_state(1, chunks_at(1500) - 1, 0));
  EXPECT_THROW(engine_->cell_state(1, chunks_at(1500), 0), std::runtime_error);
}

// The 16-bit wire (protocol.md section 11): the ranks agree on the width at
// join; the job's chunks hold twice the elements in the same bytes of packet,
// its cells (int32 sums) take about the memory of the 32-bit job's, and a
// rank joining with another width or sum shift is refused with the reason.
TEST_F(JobRegistryMemoryTest, SixteenBitJobAgreesOnTheWidthAndSizesItsChunks) {
  open(quota_);
  auto join_with = [&](ConnectionId connection, uint32_t rank, uint32_t wire_bits, std::optional<uint32_t> shift) {
    JoinRequest request{1, rank, 3, kElements, 1500};
    request.wire_bits = wire_bits;
    request.sum_shift = shift;
    registry_->on_join(connection, in_addr{htonl(0x7f000001)}, request);
  };
  join_with(1, 0, wire::kNarrowBits, std::nullopt);
  join_with(2, 1, wire::kWideBits, std::nullopt);
  ASSERT_NE(outbox_.last<Error>(2), nullptr);
  EXPECT_NE(outbox_.last<Error>(2)->message.find("wire_bits 32"), std::string::npos) << outbox_.last<Error>(2)->message;
  join_with(3, 1, wire::kNarrowBits, 2);
  ASSERT_NE(outbox_.last<Error>(3), nullptr);
  EXPECT_NE(outbox_.last<Error>(3)->message.find("sum_shift 2"), std::string::npos) << outbox_.last<Error>(3)->message;
  join_with(4, 1, wire::kNarrowBits, std::nullopt);
  join_with(5, 2, wire::kNarrowBits, std::nullopt);
  const Start* start = outbox_.last<Start>(5);
  ASSERT_NE(start, nullptr) << "the job did not start";
  EXPECT_EQ(start->wire_bits, wire::kNarrowBits);
  EXPECT_EQ(start->chunk_elements, 720u);
  const uint32_t chunks = wire::layout_for(kElements, 720).total();
  EXPECT_EQ(start->chunks, chunks);
  EXPECT_EQ(used(), wire::cell_bytes(chunks, 720));
  EXPECT_NO_THROW(engine_->cell_state(1, chunks - 1, 0));
}

TEST_F(JobRegistryMemoryTest, SumShiftBelowTheRanksLog2IsRefused) {
  open(quota_);
  JoinRequest request{1, 0, 5, kElements, 1500};
  request.wire_bits = wire::kNarrowBits;
  request.sum_shift = 2;  // 5 ranks need 3
  registry_->on_join(1, in_addr{htonl(0x7f000001)}, request);
  ASSERT_NE(outbox_.last<Error>(1), nullptr);
  EXPECT_NE(outbox_.last<Error>(1)->message.find("sum_shift 2 is below ceil(log2 5) = 3"), std::string::npos)
      << outbox_.last<Error>(1)->message;
  EXPECT_EQ(used(), 0u);
}

// Failover (docs/protocol.md section 8): aggregator 1 of [1, 1, 1] survives
// aggregator 0. The first request of its kind goes to the other ranks; the
// job's cells are re-created for the survivors' placement under a new token
// only once every rank asked alike; an epoch not beyond the job's is refused.
TEST_F(JobRegistryMemoryTest, ReshardAppliesOnceEveryRankAskedAlikeUnderANewToken) {
  open(quota_);
  for (uint32_t rank = 0; rank < 2; ++rank) {
    JoinRequest request{1, rank, 2, kElements, 1500, 1, {1, 1, 1}, {}};
    registry_->on_join(rank + 1, in_addr{htonl(0x7f000001)}, request);
  }
  ASSERT_NE(outbox_.last<Start>(1), nullptr);
  const uint64_t old_token = std::get<JoinReply>(outbox_.sent[1].front()).token;
  const ReshardRequest request{1, {0}, 0, {1, 1}};
  registry_->on_reshard(1, request);
  ASSERT_NE(outbox_.last<ReshardRequest>(2), nullptr) << "the other rank learns of the failure";
  EXPECT_EQ(*outbox_.last<ReshardRequest>(2), request);
  EXPECT_EQ(outbox_.last<Resharded>(1), nullptr) << "applied before every rank asked";
  registry_->on_reshard(2, request);
  for (ConnectionId connection : {1, 2}) {
    const Resharded* resharded = outbox_.last<Resharded>(connection);
    ASSERT_NE(resharded, nullptr);
    EXPECT_EQ(resharded->epoch, 1u);
    EXPECT_NE(resharded->token, old_token);
    const uint32_t job_chunks = wire::layout_for(kElements, wire::chunk_elements_for(1500)).total();
    EXPECT_EQ(resharded->chunks, (job_chunks + 1) / 2);
  }
  EXPECT_EQ(used(), wire::cell_bytes((chunks_at(1500) + 1) / 2, wire::chunk_elements_for(1500)));
  registry_->on_reshard(1, request);
  ASSERT_NE(outbox_.last<Error>(1), nullptr);
  EXPECT_NE(outbox_.last<Error>(1)->message.find("epoch 1"), std::string::npos) << outbox_.last<Error>(1)->message;
}

// A leaf job (docs/design.md, "Hierarchy") joins its parent only once all of
// its ranks have, as rank `leaf` of `leaves` listening on the data port, and
// starts its ranks only when the parent's job has started.
class LeafJobTest : public JobRegistryMemoryTest {
 protected:
  void join_leaf(ConnectionId connection, uint32_t rank, const ParentJob& parent) {
    JoinRequest request{1, rank, 2, kElements, 9000};
    request.parent = parent;
    registry_->on_join(connection, in_addr{htonl(0x7f000001)}, request);
  }
  const ParentJob parent_{"198.18.0.9", 1, 3};
};

TEST_F(LeafJobTest, JoinsItsParentOnceEveryRankJoined) {
  open(quota_);
  join_leaf(1, 0, parent_);
  EXPECT_TRUE(parents_.joins.empty());
  join_leaf(2, 1, parent_);
  ASSERT_EQ(parents_.joins.size(), 1u);
  const JoinRequest& up = parents_.joins[0].second;
  EXPECT_EQ(up.job_id, 1u);
  EXPECT_EQ(up.rank, parent_.leaf);
  EXPECT_EQ(up.world_size, parent_.leaves);
  EXPECT_EQ(up.elements, kElements);
  EXPECT_EQ(up.listen_port, wire::kDefaultDataPort);
  EXPECT_EQ(up.wire_bits, wire::kWideBits);
  EXPECT_EQ(outbox_.last<Start>(1), nullptr) << "the ranks start with the parent's job";
}

TEST_F(LeafJobTest, RankNamingAnotherParentIsRefused) {
  open(quota_);
  join_leaf(1, 0, parent_);
  join_leaf(2, 1, ParentJob{"198.18.0.9", 2, 3});
  ASSERT_NE(outbox_.last<Error>(2), nullptr);
  EXPECT_NE(outbox_.last<Error>(2)->message.find("leaf 2 of 3"), std::string::npos) << outbox_.last<Error>(2)->message;
  EXPECT_TRUE(parents_.joins.empty());
}

TEST_F(LeafJobTest, ParentFailureReachesEveryRankAndEndsTheMembership) {
  open(quota_);
  join_leaf(1, 0, parent_);
  join_leaf(2, 1, parent_);
  registry_->on_parent_failed(1, "job 1: parent aggregator 198.18.0.9:9988: no answer for 500 ms: it is dead");
  for (ConnectionId connection : {1, 2}) {
    ASSERT_NE(outbox_.last<Error>(connection), nullptr);
    EXPECT_NE(outbox_.last<Error>(connection)->message.find("198.18.0.9"), std::string::npos);
  }
  ASSERT_EQ(parents_.ends.size(), 1u);
  EXPECT_FALSE(parents_.ends[0].second) << "aborted: the parent's job must end for every leaf";
  EXPECT_EQ(used(), 0u);
}

TEST_F(LeafJobTest, ParentThatWouldSendResultsElsewhereFailsTheJob) {
  open(quota_);
  join_leaf(1, 0, parent_);
  join_leaf(2, 1, parent_);
  ParentStarted started{JoinReply{42, 9987, 20003, "198.18.255.255"}, Start{9000, 2048, 100},
                        in_addr{htonl(0xc6120009)}, in_addr{htonl(0xc6120005)}, {}};
  registry_->on_parent_started(1, started);
  ASSERT_NE(outbox_.last<Error>(1), nullptr);
  EXPECT_NE(outbox_.last<Error>(1)->message.find("does not take leaf aggregators"), std::string::npos)
      << outbox_.last<Error>(1)->message;
}

}  // namespace
}  // namespace xagg::control
