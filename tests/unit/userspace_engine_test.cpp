// The user-space UDP engine's cell rules for short chunks, over loopback: a
// share whose element count differs from the cell's first share is dropped
// and counted, and the rest of the chunk still completes; its ECN echo; and
// a reduce-scatter chunk's values for its owner alone.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "engine.h"
#include "unique_fd.h"
#include "wire.h"

namespace xagg::control {
namespace {

constexpr uint32_t kJobId = 3;
constexpr uint64_t kToken = 0x55aa55aa55aa55aaull;

sockaddr_in loopback(const char* address, uint16_t port) {
  sockaddr_in out{};
  out.sin_family = AF_INET;
  out.sin_port = htons(port);
  inet_pton(AF_INET, address, &out.sin_addr);
  return out;
}

// A UDP socket bound to address:port; port 0 takes one the kernel picks, and
// port returns the one bound.
UniqueFd bound_socket(const char* address, uint16_t& port) {
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in local = loopback(address, port);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&local), sizeof(local)), 0) << address << ":" << port;
  socklen_t length = sizeof(local);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &length);
  port = ntohs(local.sin_port);
  return fd;
}

void send_share(int fd, uint16_t data_port, uint16_t rank, size_t elements, uint32_t chunk = 0, uint8_t flags = 0) {
  std::vector<std::byte> packet(wire::packet_bytes(elements));
  wire::Header header;
  header.job_id = kJobId;
  header.token = kToken;
  header.rank = rank;
  header.chunk = chunk;
  header.flags = flags;
  wire::encode_header(header, packet);
  std::fill_n(wire::payload(packet.data()), elements, int32_t{1});
  sockaddr_in aggregator = loopback("127.0.0.1", data_port);
  ASSERT_EQ(::sendto(fd, packet.data(), packet.size(), 0, reinterpret_cast<sockaddr*>(&aggregator),
                     sizeof(aggregator)),
            static_cast<ssize_t>(packet.size()));
}

// Polls the job's counters until `counter` reaches `value` or a second passes.
uint64_t await_counter(const Engine& engine, xagg_counter counter, uint64_t value) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  uint64_t seen = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    for (const auto& job : engine.counters().jobs)
      if (job.job_id == kJobId) seen = job.counters[counter];
    if (seen >= value) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return seen;
}

// The next datagram on fd, decoded (a second's wait at most).
wire::Header receive_result(int fd, std::vector<std::byte>& packet) {
  packet.resize(wire::kReceiveSlotBytes);
  timeval timeout{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ssize_t length = ::recv(fd, packet.data(), packet.size(), 0);
  EXPECT_GT(length, 0) << "no RESULT";
  packet.resize(static_cast<size_t>(std::max<ssize_t>(length, 0)));
  wire::Decoded decoded = wire::decode_packet(packet);
  EXPECT_TRUE(decoded.header) << wire::to_string(decoded.error);
  return decoded.header.value_or(wire::Header{});
}

// An engine on loopback with a two-rank job of `chunks` chunks; rank 0's address is the broadcast.
struct TwoRankJob {
  explicit TwoRankJob(uint32_t chunks) {
    bound_socket("127.0.0.1", data_port);  // a free port, closed again for the engine
    engine = make_userspace_engine(data_port, 1);
    // Every rank listens on the job's result port, each on its own address.
    rank0 = bound_socket("127.0.0.2", result_port);
    rank1 = bound_socket("127.0.0.3", result_port);
    const in_addr address0 = loopback("127.0.0.2", 0).sin_addr, address1 = loopback("127.0.0.3", 0).sin_addr;
    engine->add_job({kJobId, kToken, 2, chunks, address0, result_port,
                     {{0, address0, result_port}, {1, address1, result_port}}});
  }
  uint16_t data_port = 0;
  std::unique_ptr<Engine> engine;
  uint16_t result_port = 0;
  UniqueFd rank0, rank1;
};

TEST(UserspaceEngine, ShareOfAnotherLengthIsDroppedAndCounted) {
  TwoRankJob job(1);
  auto& [data_port, engine, result_port, rank0, rank1] = job;

  send_share(rank0.get(), data_port, 0, 100);
  EXPECT_EQ(await_counter(*engine, XAGG_CNT_AGGREGATED, 1), 1u);
  send_share(rank1.get(), data_port, 1, 101);
  EXPECT_EQ(await_counter(*engine, XAGG_CNT_LENGTH_MISMATCH, 1), 1u);
  EXPECT_EQ(engine->cell_state(kJobId, 0, 0).arrived, 1u);
  send_share(rank1.get(), data_port, 1, 100);
  EXPECT_EQ(await_counter(*engine, XAGG_CNT_COMPLETED, 1), 1u);

  // The broadcast RESULT carries the chunk's 100 elements, each the sum of two shares.
  std::vector<std::byte> result;
  wire::Header header = receive_result(rank0.get(), result);
  ASSERT_EQ(result.size(), wire::packet_bytes(100));
  EXPECT_EQ(header.type, wire::MsgType::Result);
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(wire::payload(result.data())[i], 2) << i;
}

// CE on one share's IP header sets the RESULT's CE flag (protocol.md 3.3);
// unmarked shares leave it clear.
TEST(UserspaceEngine, CeOnAShareIsEchoedInTheResult) {
  TwoRankJob job(2);
  auto& [data_port, engine, result_port, rank0, rank1] = job;
  int congestion_experienced = wire::kEcnCe;
  ASSERT_EQ(::setsockopt(rank1.get(), IPPROTO_IP, IP_TOS, &congestion_experienced, sizeof(int)), 0);

  std::vector<std::byte> result;
  send_share(rank0.get(), data_port, 0, 100, 0);
  send_share(rank1.get(), data_port, 1, 100, 0);
  EXPECT_EQ(receive_result(rank0.get(), result).flags, wire::kFlagCongestionExperienced);

  int ect0 = wire::kEcnEct0;
  ASSERT_EQ(::setsockopt(rank1.get(), IPPROTO_IP, IP_TOS, &ect0, sizeof(int)), 0);
  send_share(rank0.get(), data_port, 0, 100, 1);
  send_share(rank1.get(), data_port, 1, 100, 1);
  EXPECT_EQ(receive_result(rank0.get(), result).flags, 0);
}

// A reduce-scatter chunk owned by rank 1 (protocol.md section 10): rank 1 gets
// the values, the broadcast (rank 0's address here) the header alone.
TEST(UserspaceEngine, ScatterChunkGivesItsValuesToItsOwnerOnly) {
  TwoRankJob job(1);
  auto& [data_port, engine, result_port, rank0, rank1] = job;
  send_share(rank0.get(), data_port, 0, 100, 0, wire::kFlagScatter);
  send_share(rank1.get(), data_port, 1, 100, 0, wire::kFlagScatter | wire::kFlagOwner);
  std::vector<std::byte> result;
  wire::Header owner = receive_result(rank1.get(), result);
  EXPECT_EQ(result.size(), wire::packet_bytes(100));
  EXPECT_EQ(owner.flags, wire::kFlagScatter);
  EXPECT_EQ(owner.rank, 1);
  wire::Header other = receive_result(rank0.get(), result);
  EXPECT_EQ(result.size(), wire::kHeaderBytes);
  EXPECT_EQ(other.flags, wire::kFlagScatter);
  EXPECT_EQ(other.rank, 1);
  EXPECT_EQ(await_counter(*engine, XAGG_CNT_SCATTER_HEADERS, 1), 1u);
}

}  // namespace
}  // namespace xagg::control
