// The user-space UDP engine's cell rules for short chunks, over loopback: a
// share whose element count differs from the cell's first share is dropped
// and counted, and the rest of the chunk still completes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
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

void send_share(int fd, uint16_t data_port, uint16_t rank, size_t elements) {
  std::vector<std::byte> packet(wire::packet_bytes(elements));
  wire::Header header;
  header.job_id = kJobId;
  header.token = kToken;
  header.rank = rank;
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

TEST(UserspaceEngine, ShareOfAnotherLengthIsDroppedAndCounted) {
  uint16_t data_port = 0;
  bound_socket("127.0.0.1", data_port);  // a free port, closed again for the engine
  auto engine = make_userspace_engine(data_port, 1);
  // Every rank listens on the job's result port, each on its own address.
  uint16_t result_port = 0;
  UniqueFd rank0 = bound_socket("127.0.0.2", result_port), rank1 = bound_socket("127.0.0.3", result_port);
  const in_addr address0 = loopback("127.0.0.2", 0).sin_addr, address1 = loopback("127.0.0.3", 0).sin_addr;
  engine->add_job(
      {kJobId, kToken, 2, 1, address0, result_port, {{0, address0, result_port}, {1, address1, result_port}}});

  send_share(rank0.get(), data_port, 0, 100);
  EXPECT_EQ(await_counter(*engine, XAGG_CNT_AGGREGATED, 1), 1u);
  send_share(rank1.get(), data_port, 1, 101);
  EXPECT_EQ(await_counter(*engine, XAGG_CNT_LENGTH_MISMATCH, 1), 1u);
  EXPECT_EQ(engine->cell_state(kJobId, 0, 0).arrived, 1u);
  send_share(rank1.get(), data_port, 1, 100);
  EXPECT_EQ(await_counter(*engine, XAGG_CNT_COMPLETED, 1), 1u);

  // The broadcast RESULT carries the chunk's 100 elements, each the sum of two shares.
  std::vector<std::byte> result(wire::kReceiveSlotBytes);
  timeval timeout{1, 0};
  ::setsockopt(rank0.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ssize_t length = ::recv(rank0.get(), result.data(), result.size(), 0);
  ASSERT_EQ(length, static_cast<ssize_t>(wire::packet_bytes(100)));
  wire::Decoded decoded = wire::decode_packet({result.data(), static_cast<size_t>(length)});
  ASSERT_TRUE(decoded.header) << wire::to_string(decoded.error);
  EXPECT_EQ(decoded.header->type, wire::MsgType::Result);
  EXPECT_EQ(decoded.elements, 100u);
  for (size_t i = 0; i < decoded.elements; ++i) ASSERT_EQ(wire::payload(result.data())[i], 2) << i;
}

}  // namespace
}  // namespace xagg::control
