// The pipeline's admission of all-reduces: one whose buffer overlaps a
// running one's waits for it. Its move to a new placement after a failover:
// what is in flight and the latest completed uses go to the survivor under
// its new token, and results of the old token no longer count.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <map>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "pipeline.h"
#include "reductions.h"
#include "unique_fd.h"
#include "wire.h"
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
  uint64_t ask(uint32_t, uint32_t, std::span<const uint32_t>, Clock::time_point) override { return 0; }
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
    return pipeline.try_start(reduction, 0, Clock::now() + 1h, [](std::exception_ptr) {});
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
  const Clock::time_point start{std::chrono::seconds{100}};
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
  const Clock::time_point start{std::chrono::seconds{100}};
  worker::MinRoundTrip round_trip;
  round_trip.sample(1ms, start);
  round_trip.sample(5ms, start + worker::MinRoundTrip::kWindow);
  EXPECT_EQ(round_trip.get(), 1ms);  // the previous window still counts
  round_trip.sample(4ms, start + 2 * worker::MinRoundTrip::kWindow);
  EXPECT_EQ(round_trip.get(), 4ms);
}

// A UDP socket on 127.0.0.1 standing in for an aggregator's data port.
struct FakeAggregator {
  FakeAggregator() : fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) {
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address));
    socklen_t length = sizeof(address);
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length);
    timeval wait{0, 200'000};
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  }
  // The next DATA's header and payload; none within 200 ms.
  std::optional<std::pair<wire::Header, std::vector<int32_t>>> receive() {
    std::byte packet[wire::kPacketBytes];
    ssize_t length = ::recv(fd.get(), packet, sizeof(packet), 0);
    if (length <= 0) return std::nullopt;
    wire::Decoded decoded = wire::decode_packet({packet, static_cast<size_t>(length)});
    const int32_t* values = wire::payload(packet);
    return std::pair{*decoded.header, std::vector<int32_t>(values, values + decoded.elements)};
  }
  // Answers DATA with its RESULT (one rank: the sum is the share) to the worker's result port.
  void answer(wire::Header header, const std::vector<int32_t>& values, uint16_t result_port) {
    header.type = wire::MsgType::Result;
    std::vector<std::byte> packet(wire::packet_bytes(static_cast<uint32_t>(values.size())));
    wire::encode_header(header, std::span(packet).first(wire::kHeaderBytes));
    std::copy(values.begin(), values.end(), wire::payload(packet.data()));
    sockaddr_in worker = address;
    worker.sin_port = htons(result_port);
    ::sendto(fd.get(), packet.data(), packet.size(), 0, reinterpret_cast<const sockaddr*>(&worker), sizeof(worker));
  }
  UniqueFd fd;
  sockaddr_in address{};
};

uint16_t free_udp_port() {
  FakeAggregator probe;
  return ntohs(probe.address.sin_port);
}

TEST(PipelineFailover, MovesWhatIsInFlightAndTheCompletedUsesToTheSurvivorUnderItsNewToken) {
  FakeAggregator first, second;
  const uint16_t result_port = free_udp_port();
  worker::UdpTransport transport({{"first", first.address, result_port}, {"second", second.address, result_port}},
                                 1 << 16);
  NoStatus status;
  worker::PipelineSettings settings{.job_id = 1, .tokens = {10, 11}, .rank = 0, .window_chunks = 4,
                                    .retransmit_interval = 10ms, .status_lead = 1ms, .keep_completed = true};
  // Job chunks 0 and 2 on the first aggregator, 1 and 3 on the second.
  worker::Pipeline pipeline(transport, ShardPlacement({1, 1}, 4), settings, status);
  std::vector<int32_t> data(16);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<int32_t>(i * 3 + 1);
  const std::vector<int32_t> input = data;
  std::unique_ptr<worker::Reduction> reduction =
      std::make_unique<worker::Int32Reduction>(data.data(), data.size(), ReduceOp::Sum, 1, 8);
  bool done = false;
  ASSERT_TRUE(pipeline.try_start(reduction, 0, Clock::now() + 1h, [&](std::exception_ptr error) {
    EXPECT_EQ(error, nullptr);
    done = true;
  }));
  auto drive = [&] {
    for (int round = 0; round < 20; ++round) pipeline.progress(-1);
  };
  drive();
  auto chunk0 = first.receive();
  auto chunk1 = second.receive();
  ASSERT_TRUE(chunk0 && chunk1);
  EXPECT_EQ(chunk0->first.token, 10u);
  EXPECT_EQ(chunk1->first.token, 11u);
  first.answer(chunk0->first, chunk0->second, result_port);  // chunk 0 completes; chunk 1 stays in flight
  drive();
  ASSERT_FALSE(done);

  // The first aggregator dies: everything goes to the second, token 21.
  pipeline.move_to(ShardPlacement({1}, 4), {1}, {10, 21}, Clock::now() + 1h);
  drive();
  std::map<uint32_t, std::pair<wire::Header, std::vector<int32_t>>> resent;  // by local index
  while (auto packet = second.receive()) resent[packet->first.chunk] = *packet;
  ASSERT_EQ(resent.size(), 2u) << "chunk 1 in flight, chunk 0 as a courtesy copy";
  for (const auto& [local, packet] : resent) {
    EXPECT_EQ(packet.first.token, 21u);
    EXPECT_EQ(packet.first.iteration, 0u) << "the same use, the same tag";
  }
  EXPECT_EQ(resent.at(0).second, chunk0->second) << "the courtesy copy holds the completed use's input";
  EXPECT_EQ(resent.at(1).second, chunk1->second);

  // A result under the old token does not count.
  second.answer(chunk1->first, chunk1->second, result_port);
  drive();
  EXPECT_FALSE(done);
  for (const auto& [local, packet] : resent) second.answer(packet.first, packet.second, result_port);
  drive();
  EXPECT_TRUE(done);
  EXPECT_TRUE(pipeline.idle()) << "the courtesy copy's result came";
  EXPECT_EQ(data, input);
}

}  // namespace
}  // namespace xagg
