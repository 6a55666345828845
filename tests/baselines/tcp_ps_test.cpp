// TCP parameter-server baseline: the split over K servers, correctness
// against a double reference, AVERAGE, bad configurations, and failures that
// must surface as exceptions naming the server, never as hangs.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <latch>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "baselines/tcp_ps/socket_util.h"
#include "baselines/tcp_ps/tcp_ps_client.h"
#include "baselines/tcp_ps/tcp_ps_server.h"

namespace xagg::baselines {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using tcp_ps::split_by_weight;

// The K servers of a job share one port, so each gets its own loopback
// address: 127.0.0.1, 127.0.0.2, ... (Linux routes all of 127/8 to lo).
std::string loopback(size_t server) { return fmt::format("127.0.0.{}", server + 1); }

// Runs a server for the lifetime of the test; port 0 picks a free one.
class ServerThread {
 public:
  ServerThread(uint32_t world_size, const std::string& address = loopback(0), uint16_t port = 0)
      : server_({.bind_address = address, .port = port, .world_size = world_size}) {
    thread_ = std::jthread([this] { server_.run(); });
  }
  ~ServerThread() { stop(); }
  uint16_t port() const { return server_.port(); }
  void stop() { server_.stop(); }

 private:
  TcpPsServer server_;
  std::jthread thread_;
};

// K servers on 127.0.0.1 .. 127.0.0.K, all on the first one's free port.
class ServerGroup {
 public:
  ServerGroup(size_t count, uint32_t world_size) {
    servers_.push_back(std::make_unique<ServerThread>(world_size));
    for (size_t server = 1; server < count; ++server)
      servers_.push_back(std::make_unique<ServerThread>(world_size, loopback(server), port()));
  }
  uint16_t port() const { return servers_[0]->port(); }
  std::vector<std::string> addresses() const {
    std::vector<std::string> addresses;
    for (size_t server = 0; server < servers_.size(); ++server) addresses.push_back(loopback(server));
    return addresses;
  }
  ServerThread& operator[](size_t server) { return *servers_[server]; }

 private:
  std::vector<std::unique_ptr<ServerThread>> servers_;
};

TcpPsClientConfig client_config(uint16_t port, uint32_t rank, uint32_t world_size, uint64_t max_elements,
                                std::vector<std::string> servers = {loopback(0)}, std::vector<uint32_t> weights = {}) {
  TcpPsClientConfig config;
  config.servers = std::move(servers);
  config.weights = std::move(weights);
  config.port = port;
  config.rank = rank;
  config.world_size = world_size;
  config.max_elements = max_elements;
  config.join_timeout = 10s;
  config.operation_timeout = 30s;
  return config;
}

// ---- the split ---------------------------------------------------------------

TEST(TcpPsSplit, ProportionalWithLargestRemainders) {
  const std::vector<uint32_t> equal3{1, 1, 1}, uneven{1, 2, 5};
  EXPECT_EQ(split_by_weight(10, equal3), (std::vector<size_t>{4, 3, 3}));
  EXPECT_EQ(split_by_weight(11, equal3), (std::vector<size_t>{4, 4, 3}));
  EXPECT_EQ(split_by_weight(8, uneven), (std::vector<size_t>{1, 2, 5}));
  // Quotas 1.125, 2.25, 5.625: the spare element goes to the largest fraction.
  EXPECT_EQ(split_by_weight(9, uneven), (std::vector<size_t>{1, 2, 6}));
  // Quotas 1.25, 2.5, 6.25.
  EXPECT_EQ(split_by_weight(10, uneven), (std::vector<size_t>{1, 3, 6}));
}

TEST(TcpPsSplit, FewerElementsThanServersGoToTheEarliestOfEqualRemainders) {
  const std::vector<uint32_t> equal3{1, 1, 1}, uneven{3, 1};
  EXPECT_EQ(split_by_weight(0, equal3), (std::vector<size_t>{0, 0, 0}));
  EXPECT_EQ(split_by_weight(1, equal3), (std::vector<size_t>{1, 0, 0}));
  EXPECT_EQ(split_by_weight(2, equal3), (std::vector<size_t>{1, 1, 0}));
  EXPECT_EQ(split_by_weight(1, uneven), (std::vector<size_t>{1, 0}));
}

TEST(TcpPsSplit, SumsToCountAndStaysWithinOneOfTheQuota) {
  const std::vector<std::vector<uint32_t>> weight_sets{
      {1}, {1, 1}, {3, 1}, {1, 2, 5}, {7, 7, 7, 7, 7}, std::vector<uint32_t>(64, 1), {UINT32_MAX, 1, UINT32_MAX}};
  for (const auto& weights : weight_sets) {
    const auto total = std::accumulate(weights.begin(), weights.end(), __int128{0});
    for (uint64_t count : {uint64_t{1}, uint64_t{63}, uint64_t{1000}, uint64_t{4'194'307}, uint64_t{1} << 40}) {
      const auto sizes = split_by_weight(count, weights);
      ASSERT_EQ(sizes.size(), weights.size());
      EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), uint64_t{0}), count);
      for (size_t server = 0; server < weights.size(); ++server) {
        // |size - count * weight / total| < 1, in integers.
        const __int128 deviation = __int128{sizes[server]} * total - __int128{count} * weights[server];
        EXPECT_LT(deviation < 0 ? -deviation : deviation, total) << "count " << count << " server " << server;
      }
    }
  }
}

// ---- results -----------------------------------------------------------------

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

// A job over one server per weight.
void run_job(const std::vector<uint32_t>& weights, uint32_t world_size, size_t elements, uint32_t iterations,
             ReduceOp op) {
  ServerGroup servers(weights.size(), world_size);
  std::vector<std::jthread> workers;
  for (uint32_t rank = 0; rank < world_size; ++rank) {
    workers.emplace_back([&, rank] {
      TcpPsClient client(client_config(servers.port(), rank, world_size, elements, servers.addresses(), weights));
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
  run_job({1}, world_size, elements, elements > 1'000'000 ? 2 : 3, ReduceOp::Sum);
}

INSTANTIATE_TEST_SUITE_P(WorldSizesAndLengths, TcpPsSumTest,
                         testing::Combine(testing::Values(1u, 2u, 4u),
                                          testing::Values(size_t{1}, size_t{1000}, size_t{1} << 20, size_t{16} << 20)));

// Server weights, world size, elements; lengths below K leave servers without a piece.
class TcpPsShardedSumTest : public testing::TestWithParam<std::tuple<std::vector<uint32_t>, uint32_t, size_t>> {};

TEST_P(TcpPsShardedSumTest, SumsMatchDoubleReference) {
  auto [weights, world_size, elements] = GetParam();
  run_job(weights, world_size, elements, 3, ReduceOp::Sum);
}

INSTANTIATE_TEST_SUITE_P(
    ServersWeightsWorldSizesAndLengths, TcpPsShardedSumTest,
    testing::Combine(testing::Values(std::vector<uint32_t>{1, 1}, std::vector<uint32_t>{3, 1},
                                     std::vector<uint32_t>{1, 1, 1}, std::vector<uint32_t>{1, 2, 5}),
                     testing::Values(2u, 3u, 4u),
                     testing::Values(size_t{1}, size_t{2}, size_t{1001}, size_t{1} << 20)));

TEST(TcpPs, AverageDividesByWorldSize) { run_job({1}, 4, 100'000, 2, ReduceOp::Average); }

TEST(TcpPs, ShardedAverageDividesByWorldSize) { run_job({2, 1, 1}, 4, 100'003, 2, ReduceOp::Average); }

TEST(TcpPs, ServesOneJobAfterAnother) {
  ServerGroup servers(2, 2);
  for (int job = 0; job < 2; ++job) {
    std::vector<std::jthread> workers;
    for (uint32_t rank = 0; rank < 2; ++rank) {
      workers.emplace_back([&, rank] {
        TcpPsClient client(client_config(servers.port(), rank, 2, 10, servers.addresses()));
        std::vector<float> gradient(10, static_cast<float>(rank + 1));
        client.allreduce(gradient.data(), gradient.size());
        EXPECT_EQ(gradient, std::vector<float>(10, 3.0f));
      });
    }
  }
}

// ---- configuration -----------------------------------------------------------

void expect_config_error(const TcpPsClientConfig& config, const std::string& message) {
  try {
    TcpPsClient client(config);
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
  }
}

TEST(TcpPs, RefusesBadServerLists) {
  // Refused before any connection, so no server has to run.
  expect_config_error(client_config(9, 0, 1, 10, {}), "no servers configured");
  std::vector<std::string> too_many;
  for (size_t server = 0; server < 65; ++server) too_many.push_back(loopback(server));
  expect_config_error(client_config(9, 0, 1, 10, too_many), "65 servers configured, at most 64");
  expect_config_error(client_config(9, 0, 1, 10, {loopback(0), loopback(1)}, {1}), "1 server weights for 2 servers");
  expect_config_error(client_config(9, 0, 1, 10, {loopback(0), loopback(1)}, {1, 0}),
                      "server 1 (127.0.0.2) has weight 0");
  expect_config_error(client_config(9, 0, 1, 10, {loopback(0), loopback(1), loopback(0)}),
                      "server 127.0.0.1 listed twice");
  expect_config_error(client_config(9, 0, 1, 10, {loopback(0), "localhost"}), "'localhost' is not an IPv4 address");
}

TEST(TcpPs, RefusalByAnyServerNamesIt) {
  ServerThread agreeing(1);
  ServerThread disagreeing(3, loopback(1), agreeing.port());
  expect_config_error(client_config(agreeing.port(), 0, 1, 10, {loopback(0), loopback(1)}),
                      fmt::format("127.0.0.2:{} refused rank 0: world size 1 but the job has 3", agreeing.port()));
}

// ---- failures ----------------------------------------------------------------

TEST(TcpPs, DisconnectMidIterationFailsTheOthers) {
  constexpr size_t kElements = 1 << 20;
  ServerThread server(3);
  std::vector<std::jthread> workers;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    workers.emplace_back([&, rank] {
      TcpPsClient client(client_config(server.port(), rank, 3, kElements));
      std::vector<float> gradient(kElements, 1.0f);
      const auto start = Clock::now();
      EXPECT_THROW(client.allreduce(gradient.data(), kElements), CommError);
      EXPECT_LT(Clock::now() - start, 5s);
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
  ServerGroup servers(2, 2);
  std::vector<std::jthread> workers;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    workers.emplace_back([&, rank] {
      TcpPsClient client(client_config(servers.port(), rank, 2, 1000, servers.addresses()));
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
  const auto start = Clock::now();
  EXPECT_THROW(client.allreduce(gradient.data(), gradient.size()), CommError);
  EXPECT_LT(Clock::now() - start, 5s);
}

// Expects every rank's error to name `server`. The ranks keep their clients
// until all have failed: a client's other connections closing would make
// the healthy servers fail the job too, and a rank could hear of that first.
class FailureWitness {
 public:
  FailureWitness(uint32_t world_size, std::string server)
      : all_failed_(world_size), server_(std::move(server)), failed_at_(world_size) {}

  // Runs all-reduces until one throws, at most `patience` long.
  void allreduce_until_failure(TcpPsClient& client, size_t elements, std::chrono::seconds patience) {
    std::vector<float> gradient(elements, 1.0f);
    const auto give_up = Clock::now() + patience;
    try {
      while (Clock::now() < give_up) {
        client.allreduce(gradient.data(), elements);
        ++completed_;
      }
      ADD_FAILURE() << "rank " << client.rank() << " saw no failure in " << patience.count() << " s";
    } catch (const CommError& error) {
      failed_at_[client.rank()] = Clock::now();
      EXPECT_NE(std::string(error.what()).find(server_), std::string::npos)
          << "rank " << client.rank() << ": " << error.what();
    }
    all_failed_.arrive_and_wait();
  }

  uint64_t completed() const { return completed_; }
  // When the last rank failed; call once every rank has.
  Clock::time_point last_failure() const { return *std::max_element(failed_at_.begin(), failed_at_.end()); }

 private:
  std::latch all_failed_;
  const std::string server_;
  std::atomic<uint64_t> completed_ = 0;
  std::vector<Clock::time_point> failed_at_;  // by rank
};

TEST(TcpPs, StoppedServerFailsEveryRankNamingIt) {
  constexpr uint32_t kWorldSize = 2;
  constexpr size_t kElements = 1 << 18;
  ServerGroup servers(3, kWorldSize);
  FailureWitness witness(kWorldSize, fmt::format("server 127.0.0.2:{}", servers.port()));
  Clock::time_point stopped_at;
  {
    std::vector<std::jthread> workers;
    for (uint32_t rank = 0; rank < kWorldSize; ++rank) {
      workers.emplace_back([&, rank] {
        TcpPsClient client(client_config(servers.port(), rank, kWorldSize, kElements, servers.addresses()));
        witness.allreduce_until_failure(client, kElements, 20s);
      });
    }
    const auto give_up = Clock::now() + 10s;
    while (witness.completed() < 4 && Clock::now() < give_up) std::this_thread::sleep_for(1ms);
    EXPECT_GE(witness.completed(), 4u) << "the job never got under way";
    stopped_at = Clock::now();
    servers[1].stop();
  }
  EXPECT_LT(witness.last_failure() - stopped_at, 5s);
}

// Plays a server that dies mid-job: answers every rank's hello, takes part of
// each gradient, then resets every connection, as the kernel does when a
// server process is killed with data unread.
class KilledServer {
 public:
  KilledServer(uint32_t world_size, const std::string& address, uint16_t port) {
    sockaddr_in bound = tcp_ps::make_address(address, port);
    listener_ = tcp_ps::UniqueFd(::socket(AF_INET, SOCK_STREAM, 0));
    int on = 1;
    setsockopt(listener_.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (::bind(listener_.get(), reinterpret_cast<sockaddr*>(&bound), sizeof(bound)) != 0 ||
        ::listen(listener_.get(), static_cast<int>(world_size)) != 0)
      tcp_ps::throw_errno("binding the killed server");
    thread_ = std::jthread([this, world_size] { serve_then_die(world_size); });
  }
  // Wakes accept() should a rank never have connected.
  ~KilledServer() { ::shutdown(listener_.get(), SHUT_RDWR); }

 private:
  void serve_then_die(uint32_t world_size) {
    std::vector<tcp_ps::UniqueFd> ranks;
    for (uint32_t rank = 0; rank < world_size; ++rank) {
      ranks.emplace_back(::accept(listener_.get(), nullptr, nullptr));
      tcp_ps::Hello hello;
      tcp_ps::recv_all(ranks.back().get(), &hello, sizeof(hello));
    }
    for (auto& rank : ranks) {
      tcp_ps::HelloReply reply{tcp_ps::kMagic, tcp_ps::HelloStatus::Accepted, 0, world_size};
      tcp_ps::send_all(rank.get(), &reply, sizeof(reply));
    }
    std::vector<char> part(sizeof(tcp_ps::Request) + 64 * 1024);
    for (auto& rank : ranks) tcp_ps::recv_all(rank.get(), part.data(), part.size());
    const linger reset{1, 0};
    for (auto& rank : ranks) {
      setsockopt(rank.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
      rank.reset();
    }
  }

  tcp_ps::UniqueFd listener_;
  std::jthread thread_;
};

TEST(TcpPs, KilledServerFailsEveryRankNamingIt) {
  constexpr uint32_t kWorldSize = 3;
  constexpr size_t kElements = 1 << 20;
  ServerThread healthy(kWorldSize);
  KilledServer killed(kWorldSize, loopback(1), healthy.port());
  FailureWitness witness(kWorldSize, fmt::format("server 127.0.0.2:{}", healthy.port()));
  const auto start = Clock::now();
  {
    std::vector<std::jthread> workers;
    for (uint32_t rank = 0; rank < kWorldSize; ++rank) {
      workers.emplace_back([&, rank] {
        TcpPsClient client(
            client_config(healthy.port(), rank, kWorldSize, kElements, {loopback(0), loopback(1)}, {1, 3}));
        witness.allreduce_until_failure(client, kElements, 20s);
      });
    }
  }
  EXPECT_EQ(witness.completed(), 0u);
  EXPECT_LT(witness.last_failure() - start, 5s);
}

// Accepts one connection and answers its hello if asked to, then stays silent.
class SilentServer {
 public:
  SilentServer(bool accept_hello, const std::string& address = loopback(0), uint16_t port = 0) {
    sockaddr_in bound = tcp_ps::make_address(address, port);
    listener_ = tcp_ps::UniqueFd(::socket(AF_INET, SOCK_STREAM, 0));
    ::bind(listener_.get(), reinterpret_cast<sockaddr*>(&bound), sizeof(bound));
    ::listen(listener_.get(), 1);
    socklen_t length = sizeof(bound);
    getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&bound), &length);
    port_ = ntohs(bound.sin_port);
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

TEST(TcpPs, SilentServerTimesOutTheAllReduceNamingItsPiece) {
  ServerThread healthy(1);
  SilentServer silent(true, loopback(1), healthy.port());
  auto config = client_config(healthy.port(), 0, 1, 1000, {loopback(0), loopback(1)});
  config.operation_timeout = 300ms;
  TcpPsClient client(config);
  std::vector<float> gradient(1000, 1.0f);
  try {
    client.allreduce(gradient.data(), gradient.size());
    ADD_FAILURE() << "no TimeoutError";
  } catch (const TimeoutError& error) {
    // The healthy server's piece, bytes [0, 2000), came back.
    EXPECT_EQ(std::string(error.what()),
              fmt::format("tcp-ps: rank 0 all-reduce #0 of 1000 floats timed out after 300 ms: 127.0.0.2:{} pushed "
                          "2000 of 2000 bytes, results missing for bytes [2000, 4000)",
                          healthy.port()));
  }
  EXPECT_THROW(client.allreduce(gradient.data(), gradient.size()), CommError);  // unusable after a failure
}

}  // namespace
}  // namespace xagg::baselines
