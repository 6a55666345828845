// TCP parameter-server baseline: correctness against a double reference,
// AVERAGE, and failures that must surface as exceptions, never as hangs.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "baselines/tcp_ps/socket_util.h"
#include "baselines/tcp_ps/tcp_ps_client.h"
#include "baselines/tcp_ps/tcp_ps_server.h"

namespace xagg::baselines {
namespace {

using namespace std::chrono_literals;

// Runs a server on a free loopback port for the lifetime of the test.
class ServerThread {
 public:
  explicit ServerThread(uint32_t world_size) : server_({.port = 0, .world_size = world_size}) {
    thread_ = std::jthread([this] { server_.run(); });
  }
  ~ServerThread() { server_.stop(); }
  uint16_t port() const { return server_.port(); }

 private:
  TcpPsServer server_;
  std::jthread thread_;
};

TcpPsClientConfig client_config(uint16_t port, uint32_t rank, uint32_t world_size, uint64_t max_elements) {
  TcpPsClientConfig config;
  config.server = "127.0.0.1";
  config.port = port;
  config.rank = rank;
  config.world_size = world_size;
  config.max_elements = max_elements;
  config.join_timeout = 10s;
  config.operation_timeout = 30s;
  return config;
}

// Deterministic value of rank's element i in an iteration, in [-1, 1) with mixed magnitudes.
float gradient_value(uint32_t rank, uint32_t iteration, size_t i) {
  uint64_t x = (i * 0x9E3779B97F4A7C15ull) ^ (rank * 0xC2B2AE3D27D4EB4Full) ^ (iteration * 0x165667B19E3779F9ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<float>(static_cast<int64_t>(x % 2000001) - 1000000) * 1e-6f * static_cast<float>(1 + rank);
}

// Float summation of N inputs errs by at most (N-1)*eps*sum|x|.
void expect_sums(const std::vector<float>& result, uint32_t world_size, uint32_t iteration, double divisor) {
  size_t mismatches = 0;
  for (size_t i = 0; i < result.size() && mismatches < 5; ++i) {
    double sum = 0, magnitude = 0;
    for (uint32_t rank = 0; rank < world_size; ++rank) {
      sum += gradient_value(rank, iteration, i);
      magnitude += std::fabs(gradient_value(rank, iteration, i));
    }
    const double tolerance = (world_size + 1) * 1.2e-7 * magnitude / divisor;
    if (std::fabs(result[i] - sum / divisor) > tolerance) {
      ++mismatches;
      ADD_FAILURE() << "element " << i << " iteration " << iteration << ": " << result[i] << " != " << sum / divisor;
    }
  }
}

void run_job(uint32_t world_size, size_t elements, uint32_t iterations, ReduceOp op) {
  ServerThread server(world_size);
  std::vector<std::jthread> workers;
  for (uint32_t rank = 0; rank < world_size; ++rank) {
    workers.emplace_back([&, rank] {
      TcpPsClient client(client_config(server.port(), rank, world_size, elements));
      std::vector<float> gradient(elements);
      for (uint32_t iteration = 0; iteration < iterations; ++iteration) {
        for (size_t i = 0; i < elements; ++i) gradient[i] = gradient_value(rank, iteration, i);
        client.allreduce(gradient.data(), elements, op);
        expect_sums(gradient, world_size, iteration, op == ReduceOp::Average ? world_size : 1);
      }
    });
  }
}

class TcpPsSumTest : public testing::TestWithParam<std::tuple<uint32_t, size_t>> {};

TEST_P(TcpPsSumTest, SumsMatchDoubleReference) {
  auto [world_size, elements] = GetParam();
  run_job(world_size, elements, elements > 1'000'000 ? 2 : 3, ReduceOp::Sum);
}

INSTANTIATE_TEST_SUITE_P(WorldSizesAndLengths, TcpPsSumTest,
                         testing::Combine(testing::Values(1u, 2u, 4u),
                                          testing::Values(size_t{1}, size_t{1000}, size_t{1} << 20, size_t{16} << 20)));

TEST(TcpPs, AverageDividesByWorldSize) { run_job(4, 100'000, 2, ReduceOp::Average); }

TEST(TcpPs, ServesOneJobAfterAnother) {
  ServerThread server(2);
  for (int job = 0; job < 2; ++job) {
    std::vector<std::jthread> workers;
    for (uint32_t rank = 0; rank < 2; ++rank) {
      workers.emplace_back([&, rank] {
        TcpPsClient client(client_config(server.port(), rank, 2, 10));
        std::vector<float> gradient(10, static_cast<float>(rank + 1));
        client.allreduce(gradient.data(), gradient.size());
        EXPECT_EQ(gradient, std::vector<float>(10, 3.0f));
      });
    }
  }
}

TEST(TcpPs, RefusesMismatchedWorldSize) {
  ServerThread server(2);
  EXPECT_THROW(TcpPsClient(client_config(server.port(), 0, 3, 10)), ConfigError);
}

TEST(TcpPs, DisconnectMidIterationFailsTheOthers) {
  constexpr size_t kElements = 1 << 20;
  ServerThread server(3);
  std::vector<std::jthread> workers;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    workers.emplace_back([&, rank] {
      TcpPsClient client(client_config(server.port(), rank, 3, kElements));
      std::vector<float> gradient(kElements, 1.0f);
      const auto start = std::chrono::steady_clock::now();
      EXPECT_THROW(client.allreduce(gradient.data(), kElements), CommError);
      EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
    });
  }
  // Rank 2 speaks the protocol by hand and leaves after half its gradient.
  tcp_ps::UniqueFd fd(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in address = tcp_ps::make_address("127.0.0.1", server.port());
  ASSERT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  tcp_ps::Hello hello{tcp_ps::kMagic, 2, 3, 0, kElements};
  ASSERT_TRUE(tcp_ps::send_all(fd.get(), &hello, sizeof(hello)));
  tcp_ps::HelloReply reply;
  ASSERT_TRUE(tcp_ps::recv_all(fd.get(), &reply, sizeof(reply)));
  ASSERT_EQ(reply.status, tcp_ps::HelloStatus::Accepted);
  tcp_ps::Request request{0, kElements};
  std::vector<float> half(kElements / 2, 1.0f);
  ASSERT_TRUE(tcp_ps::send_all(fd.get(), &request, sizeof(request)));
  ASSERT_TRUE(tcp_ps::send_all(fd.get(), half.data(), half.size() * sizeof(float)));
  fd.reset();
}

TEST(TcpPs, MismatchedCountsFailEveryRank) {
  ServerThread server(2);
  std::vector<std::jthread> workers;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    workers.emplace_back([&, rank] {
      TcpPsClient client(client_config(server.port(), rank, 2, 1000));
      std::vector<float> gradient(1000, 1.0f);
      EXPECT_THROW(client.allreduce(gradient.data(), 500 + rank), CommError);
    });
  }
}

TEST(TcpPs, PartnerThatLeftFailsTheNextAllReduce) {
  ServerThread server(2);
  std::jthread partner([&] { TcpPsClient(client_config(server.port(), 1, 2, 1000)); });
  TcpPsClient client(client_config(server.port(), 0, 2, 1000));
  partner.join();
  std::vector<float> gradient(1000, 1.0f);
  EXPECT_THROW(client.allreduce(gradient.data(), gradient.size()), CommError);
}

TEST(TcpPs, StopFailsTheWaitingWorker) {
  auto server = std::make_unique<ServerThread>(2);
  const uint16_t port = server->port();
  // Rank 1 joins but never pushes, so rank 0 waits on the server until it stops.
  std::jthread idle_partner([port] {
    TcpPsClient idle(client_config(port, 1, 2, 1000));
    std::this_thread::sleep_for(1s);
  });
  TcpPsClient client(client_config(port, 0, 2, 1000));
  std::jthread stopper([&] {
    std::this_thread::sleep_for(200ms);
    server.reset();
  });
  std::vector<float> gradient(1000, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(client.allreduce(gradient.data(), gradient.size()), CommError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// Accepts one connection and answers its hello if asked to, then stays silent.
class SilentServer {
 public:
  explicit SilentServer(bool accept_hello) {
    sockaddr_in address = tcp_ps::make_address("127.0.0.1", 0);
    listener_ = tcp_ps::UniqueFd(::socket(AF_INET, SOCK_STREAM, 0));
    ::bind(listener_.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address));
    ::listen(listener_.get(), 1);
    socklen_t length = sizeof(address);
    getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::jthread([this, accept_hello] {
      connection_ = tcp_ps::UniqueFd(::accept(listener_.get(), nullptr, nullptr));
      tcp_ps::Hello hello;
      tcp_ps::recv_all(connection_.get(), &hello, sizeof(hello));
      tcp_ps::HelloReply reply{tcp_ps::kMagic, tcp_ps::HelloStatus::Accepted, 0, hello.world_size};
      if (accept_hello) tcp_ps::send_all(connection_.get(), &reply, sizeof(reply));
    });
  }
  uint16_t port() const { return port_; }

 private:
  tcp_ps::UniqueFd listener_, connection_;
  uint16_t port_ = 0;
  std::jthread thread_;
};

TEST(TcpPs, SilentServerTimesOutTheJoin) {
  SilentServer server(false);
  auto config = client_config(server.port(), 0, 2, 10);
  config.join_timeout = 300ms;
  EXPECT_THROW(TcpPsClient{config}, TimeoutError);
}

TEST(TcpPs, SilentServerTimesOutTheAllReduce) {
  SilentServer server(true);
  auto config = client_config(server.port(), 0, 1, 1000);
  config.operation_timeout = 300ms;
  TcpPsClient client(config);
  std::vector<float> gradient(1000, 1.0f);
  try {
    client.allreduce(gradient.data(), gradient.size());
    ADD_FAILURE() << "no TimeoutError";
  } catch (const TimeoutError& error) {
    EXPECT_NE(std::string(error.what()).find("results missing for bytes [0, 4000)"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace xagg::baselines
