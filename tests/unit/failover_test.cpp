// Failover's epochs and steps (docs/protocol.md section 8) without
// connections or a pipeline (end to end: tests/e2e/failover_test.cpp).
#include <gtest/gtest.h>

#include <thread>

#include "failover.h"

namespace xagg::worker {
namespace {

using std::chrono::milliseconds;

constexpr uint32_t kJobChunks = 1200;
constexpr milliseconds kTimeout{10000};

// Aggregator 1 weighs twice the others; tokens 11, 12, 13 from the joins.
Failover three_aggregators(milliseconds timeout = kTimeout) {
  return Failover({7, 2, {"10.0.0.1", "10.0.0.2", "10.0.0.3"}, {1, 2, 1}, kJobChunks, timeout}, {11, 12, 13});
}

template <class Step>
Step expect_step(Failover& failover) {
  Failover::Step step = failover.next_step();
  EXPECT_TRUE(std::holds_alternative<Step>(step)) << "step " << step.index();
  if (!std::holds_alternative<Step>(step)) throw std::logic_error("another step");
  return std::get<Step>(std::move(step));
}

TEST(Failover, NothingIsPendingUntilAnAggregatorDies) {
  Failover failover = three_aggregators();
  EXPECT_FALSE(failover.pending());
  failover.mark_dead(1, "test");
  EXPECT_TRUE(failover.pending());
  EXPECT_TRUE(failover.is_dead(1));
  EXPECT_FALSE(failover.is_dead(0));
}

TEST(Failover, AsksEverySurvivorToTakeItsPlaceAmongTheSurvivors) {
  Failover failover = three_aggregators();
  const Clock::time_point before = Clock::now();
  failover.mark_dead(1, "test");
  auto send = expect_step<Failover::SendRequests>(failover);
  ASSERT_EQ(send.requests.size(), 2u);
  EXPECT_EQ(send.requests[0].aggregator, 0u);
  EXPECT_EQ(send.requests[0].request, (control::ReshardRequest{1, {1}, 0, {1, 1}}));
  EXPECT_EQ(send.requests[1].aggregator, 2u);
  EXPECT_EQ(send.requests[1].request, (control::ReshardRequest{1, {1}, 1, {1, 1}}));
  // Bounded from the failure's detection, not from the request.
  EXPECT_GE(send.deadline, before + kTimeout);
  EXPECT_LE(send.deadline, Clock::now() + kTimeout);
}

TEST(Failover, MovesTheChunksOnceEverySurvivorAnswered) {
  Failover failover = three_aggregators();
  failover.mark_dead(1, "test");
  expect_step<Failover::SendRequests>(failover);
  expect_step<Failover::AwaitAnswers>(failover);
  failover.take_resharded(2, {1, 23, 600});
  expect_step<Failover::AwaitAnswers>(failover);
  failover.take_resharded(0, {1, 21, 600});
  auto move = expect_step<Failover::MoveChunks>(failover);
  EXPECT_EQ(move.placement.shards(), 2u);
  EXPECT_EQ(move.placement.job_chunks(), kJobChunks);
  EXPECT_EQ(move.survivors, (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(move.tokens, (std::vector<uint64_t>{21, 12, 23}));
  EXPECT_GT(move.courtesy_until, Clock::now() + kTimeout / 2);
  EXPECT_TRUE(failover.pending());
  failover.moved();
  EXPECT_FALSE(failover.pending());
}

TEST(Failover, AnswersForAnotherEpochAreIgnored) {
  Failover failover = three_aggregators();
  failover.mark_dead(1, "test");
  expect_step<Failover::SendRequests>(failover);
  failover.take_resharded(0, {0, 21, 600});
  failover.take_resharded(2, {2, 23, 600});
  expect_step<Failover::AwaitAnswers>(failover);
}

TEST(Failover, ADeathKnownAlreadyStartsNoEpoch) {
  Failover failover = three_aggregators();
  failover.mark_dead(1, "test");
  failover.mark_dead(1, "again");
  auto send = expect_step<Failover::SendRequests>(failover);
  EXPECT_EQ(send.requests[0].request.epoch, 1u);
}

TEST(Failover, ASecondDeathStartsOverWithTheFewerSurvivors) {
  Failover failover = three_aggregators();
  failover.mark_dead(1, "test");
  expect_step<Failover::SendRequests>(failover);
  failover.take_resharded(0, {1, 21, 600});
  failover.mark_dead(2, "test");
  auto send = expect_step<Failover::SendRequests>(failover);
  ASSERT_EQ(send.requests.size(), 1u);
  EXPECT_EQ(send.requests[0].aggregator, 0u);
  EXPECT_EQ(send.requests[0].request, (control::ReshardRequest{2, {1, 2}, 0, {1}}));
  // The first epoch's answer does not count for the second.
  expect_step<Failover::AwaitAnswers>(failover);
  failover.take_resharded(0, {2, 31, kJobChunks});
  auto move = expect_step<Failover::MoveChunks>(failover);
  EXPECT_EQ(move.tokens, (std::vector<uint64_t>{31, 12, 13}));
}

TEST(Failover, LearnsTheDeathsThatAnotherRanksRequestNames) {
  Failover failover = three_aggregators();
  failover.learn_failures(0, control::ReshardRequest{1, {2, 9}, 0, {1, 2}});
  EXPECT_TRUE(failover.is_dead(2));
  EXPECT_FALSE(failover.is_dead(0));
  EXPECT_FALSE(failover.is_dead(1));
  auto send = expect_step<Failover::SendRequests>(failover);
  EXPECT_EQ(send.requests[0].request, (control::ReshardRequest{1, {2}, 0, {1, 2}}));
}

TEST(Failover, FailsWhenNoAggregatorIsLeft) {
  Failover failover = three_aggregators();
  for (uint32_t aggregator = 0; aggregator < 3; ++aggregator) failover.mark_dead(aggregator, "test");
  EXPECT_EQ(expect_step<Failover::Fail>(failover).message,
            "job 7: aggregators 10.0.0.1, 10.0.0.2, 10.0.0.3 failed and no aggregator of the job is left to take over "
            "their chunks");
}

TEST(Failover, FailsWhenASurvivorDoesNotAnswerInTime) {
  Failover failover = three_aggregators(milliseconds(1));
  failover.mark_dead(1, "test");
  expect_step<Failover::SendRequests>(failover);
  failover.take_resharded(0, {1, 21, 600});
  std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(expect_step<Failover::Fail>(failover).message,
            "job 7: aggregator 10.0.0.2 failed and aggregators 10.0.0.1, 10.0.0.3 did not all take over the job's "
            "chunks within 1 ms (no answer from 10.0.0.3)");
}

TEST(Failover, FailsWhenASurvivorHoldsOtherChunksThanThePlacementGivesIt) {
  Failover failover = three_aggregators();
  failover.mark_dead(1, "test");
  expect_step<Failover::SendRequests>(failover);
  failover.take_resharded(0, {1, 21, 599});
  failover.take_resharded(2, {1, 23, 601});
  EXPECT_EQ(expect_step<Failover::Fail>(failover).message,
            "job 7: after aggregator 10.0.0.2 failed, aggregator 10.0.0.1 holds 599 chunks, but the job's layout "
            "places 600 there");
}

}  // namespace
}  // namespace xagg::worker
