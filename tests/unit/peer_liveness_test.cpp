// PeerLiveness's judgement from silence and TCP's state (the end-to-end
// behaviour over lossy and cut links: tests/e2e/liveness_test.cpp).
#include <gtest/gtest.h>

#include "peer_liveness.h"

namespace xagg {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kDeadAfter{500};
const Clock::time_point kStart{};

TcpProgress tcp(int64_t heard_ms, uint32_t retransmitted = 0, uint32_t behind_holes = 0) {
  return TcpProgress{
      .since_peer_heard = milliseconds(heard_ms), .retransmitted = retransmitted, .behind_holes = behind_holes};
}

// A path where TCP retransmitted at kStart + 100 ms and the peer was heard at kStart + 200 ms.
PeerLiveness lossy() {
  PeerLiveness liveness(kDeadAfter, kStart, tcp(0));
  EXPECT_FALSE(liveness.judge(kStart + milliseconds(100), tcp(0, 1)));
  liveness.heard(kStart + milliseconds(200));
  return liveness;
}

TEST(PeerLiveness, SilenceShorterThanDeadAfterIsAlive) {
  PeerLiveness liveness(kDeadAfter, kStart, tcp(0));
  EXPECT_FALSE(liveness.judge(kStart + milliseconds(499), tcp(499)));
}

// Its kernel acknowledges the pings and nothing was lost: the process does
// not answer, or its TCP repairs the connection's first loss.
TEST(PeerLiveness, SilenceOnAPathWithoutLossIsExcusedUpToTwiceDeadAfter) {
  PeerLiveness liveness(kDeadAfter, kStart, tcp(0));
  EXPECT_FALSE(liveness.judge(kStart + milliseconds(999), tcp(20)));
  auto death = liveness.judge(kStart + 2 * kDeadAfter, tcp(20));
  ASSERT_TRUE(death);
  EXPECT_NE(death->find("no answer on its control connection for 1000 ms; its TCP last heard 20 ms ago, on a path "
                        "without loss lately"),
            std::string::npos)
      << *death;
}

// Nothing from the peer's TCP either: a cut.
TEST(PeerLiveness, ATcpSilenceOfDeadAfterOnAPathWithoutLossIsNotExcused) {
  PeerLiveness liveness(kDeadAfter, kStart, tcp(0));
  EXPECT_TRUE(liveness.judge(kStart + kDeadAfter, tcp(500)));
}

TEST(PeerLiveness, SilenceOnALossyPathThatCarriesIsExcusedUpToTheHardLimit) {
  PeerLiveness liveness = lossy();
  EXPECT_FALSE(liveness.judge(kStart + milliseconds(1200), tcp(80, 1)));
  const auto limit = liveness.give_up_at();
  EXPECT_EQ(limit, kStart + milliseconds(200) + PeerLiveness::kMaxSilencePerDeadAfter * kDeadAfter);
  EXPECT_FALSE(liveness.judge(limit - milliseconds(1), tcp(80, 1)));
  auto death = liveness.judge(limit, tcp(80, 1));
  ASSERT_TRUE(death);
  EXPECT_NE(death->find("2000 ms; its TCP last heard 80 ms ago, on a lossy path"), std::string::npos) << *death;
}

// The peer's data behind a hole: it sends, and something was lost.
TEST(PeerLiveness, DataBehindAHoleMakesThePathLossy) {
  PeerLiveness liveness(kDeadAfter, kStart, tcp(0));
  EXPECT_FALSE(liveness.judge(kStart + milliseconds(600), tcp(30, 0, 1)));
}

// A ping lost and its retransmission too: the peer acknowledges the later
// pings selectively (SACK) while the lost one holds its answers back, and
// TCP's next retransmission timeout keeps its own silence past dead_after.
TEST(PeerLiveness, OurDataHeldBehindAHoleMakesThePathLossy) {
  TcpProgress held = tcp(504, 2);
  PeerLiveness unsacked(kDeadAfter, kStart, tcp(0));
  EXPECT_TRUE(unsacked.judge(kStart + milliseconds(705), held)) << "the same silence without SACKed data";
  held.sacked = 2;
  PeerLiveness sacked(kDeadAfter, kStart, tcp(0));
  EXPECT_FALSE(sacked.judge(kStart + milliseconds(705), held));
}

// Retransmissions into a silence are what a cut link causes too.
TEST(PeerLiveness, RetransmissionsTheSilenceHasNotEndedProveNothing) {
  PeerLiveness liveness(kDeadAfter, kStart, tcp(0));
  EXPECT_FALSE(liveness.judge(kStart + milliseconds(300), tcp(300, 1)));
  EXPECT_TRUE(liveness.judge(kStart + milliseconds(500), tcp(500, 2)));
}

TEST(PeerLiveness, LossLongPastExcusesNoMoreThanAPathWithoutLoss) {
  PeerLiveness liveness = lossy();
  const auto later = kStart + milliseconds(200) + PeerLiveness::kLossMemoryPerDeadAfter * kDeadAfter;
  liveness.heard(later - 2 * kDeadAfter);
  EXPECT_TRUE(liveness.judge(later, tcp(20, 1)));
}

// Nothing from the peer's TCP for twice dead_after on a lossy path: the path is cut.
TEST(PeerLiveness, ATcpSilenceOfTwiceDeadAfterIsNotExcused) {
  PeerLiveness liveness = lossy();
  EXPECT_FALSE(liveness.judge(kStart + milliseconds(1100), tcp(999, 5)));
  EXPECT_TRUE(liveness.judge(kStart + milliseconds(1101), tcp(1000, 6)));
}

// The answer came; the reader was not scheduled to read it.
TEST(PeerLiveness, AnAnswerWaitingUnreadIsNoSilence) {
  PeerLiveness liveness(kDeadAfter, kStart, tcp(0));
  TcpProgress waiting = tcp(200);
  waiting.unread = 16;
  EXPECT_FALSE(liveness.judge(kStart + milliseconds(700), waiting));
}

TEST(PeerLiveness, AMessageRestartsTheClock) {
  PeerLiveness liveness(kDeadAfter, kStart, tcp(0));
  liveness.heard(kStart + milliseconds(400));
  EXPECT_FALSE(liveness.judge(kStart + milliseconds(1399), tcp(0)));
  EXPECT_TRUE(liveness.judge(kStart + milliseconds(1400), tcp(0)));
}

}  // namespace
}  // namespace xagg
