// The pipeline's admission of all-reduces: one whose buffer overlaps a
// running one's waits for it.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "pipeline.h"
#include "udp_transport.h"

namespace xagg {
namespace {

using namespace std::chrono_literals;

// Touches nothing: try_start only looks at chunk_count and buffer.
class IdleReduction final : public worker::Reduction {
 public:
  IdleReduction(const int32_t* data, size_t count) : data_(data), count_(count) {}
  uint32_t chunk_count() const override { return 1; }
  std::span<const std::byte> buffer() const override { return std::as_bytes(std::span(data_, count_)); }
  bool ready(uint32_t) const override { return false; }
  bool gating(uint32_t) const override { return false; }
  wire::ElemOp op(uint32_t) const override { return wire::ElemOp::Sum; }
  uint32_t fill(uint32_t, int32_t*) override { return 0; }
  void consume(uint32_t, std::span<const int32_t>, std::vector<uint32_t>&) override {}

 private:
  const int32_t* data_;
  size_t count_;
};

class NoStatus final : public worker::ContributionStatus {
 public:
  uint64_t ask(uint32_t, uint32_t, std::span<const uint32_t>, worker::Clock::time_point) override { return 0; }
  std::optional<control::StatusReply> answer(uint64_t) const override { return std::nullopt; }
};

TEST(PipelineStart, WaitsWhileARunningReductionsBufferOverlaps) {
  sockaddr_in nowhere{};
  nowhere.sin_family = AF_INET;
  nowhere.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  worker::UdpTransport transport({{"nowhere", nowhere, 0}}, 1 << 16);
  NoStatus status;
  ShardPlacement placement({1}, 16);
  worker::Pipeline pipeline(transport, placement, {1, {1}, 0, 4, 10ms, 1ms}, status);
  int32_t data[30] = {};
  auto start = [&](size_t first, size_t count) {
    std::unique_ptr<worker::Reduction> reduction = std::make_unique<IdleReduction>(data + first, count);
    return pipeline.try_start(reduction, 0, worker::Clock::now() + 1h, [](std::exception_ptr) {});
  };
  ASSERT_TRUE(start(10, 10));   // [10, 20)
  EXPECT_FALSE(start(15, 10));  // [15, 25)
  EXPECT_FALSE(start(5, 6));    // [5, 11)
  EXPECT_FALSE(start(12, 2));   // inside
  EXPECT_TRUE(start(20, 10));   // [20, 30): adjacent
  EXPECT_TRUE(start(0, 10));    // [0, 10): adjacent
  pipeline.fail_all(nullptr);
}

TEST(TailProbe, TimesTheProbeFromTheMinimumRoundTripAndBacksOffToSilence) {
  using worker::TailProbe;
  const worker::Clock::time_point start{std::chrono::seconds{100}};
  worker::MinRoundTrip round_trip;
  TailProbe probe(10ms);
  EXPECT_FALSE(round_trip.get());
  EXPECT_EQ(probe.timeout(round_trip.get()), 10ms);  // the retransmit interval until a sample
  round_trip.sample(3ms, start);
  round_trip.sample(500us, start + 1ms);
  round_trip.sample(40ms, start + 2ms);  // waited for a slower rank: not the round trip
  EXPECT_EQ(round_trip.get(), 500us);
  EXPECT_EQ(probe.timeout(round_trip.get()), 2ms);  // 2 x 0.5 ms + 1 ms
  EXPECT_EQ(probe.timeout(6ms), 10ms);              // never above the interval

  probe.on_send(start);
  probe.on_result(start + 1ms);
  EXPECT_EQ(probe.due(500us), start + 3ms);
  probe.on_probe(start + 3ms);
  EXPECT_EQ(probe.due(500us), start + 7ms);  // doubled
  probe.on_probe(start + 7ms);
  EXPECT_EQ(probe.due(500us), start + 15ms);
  probe.on_probe(start + 15ms);
  EXPECT_FALSE(probe.due(500us)) << "a fourth probe without any result";
  probe.on_result(start + 50ms);
  EXPECT_EQ(probe.due(500us), start + 52ms);
}

TEST(MinRoundTrip, ForgetsSamplesOlderThanTwoWindows) {
  const worker::Clock::time_point start{std::chrono::seconds{100}};
  worker::MinRoundTrip round_trip;
  round_trip.sample(1ms, start);
  round_trip.sample(5ms, start + worker::MinRoundTrip::kWindow);
  EXPECT_EQ(round_trip.get(), 1ms);  // the previous window still counts
  round_trip.sample(4ms, start + 2 * worker::MinRoundTrip::kWindow);
  EXPECT_EQ(round_trip.get(), 4ms);
}

}  // namespace
}  // namespace xagg
