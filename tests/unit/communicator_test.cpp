// Communicator tests against a small user-space stand-in for the aggregator
// daemon and its XDP program on 127.0.0.1 (same control protocol and cell
// semantics, unicast results). The real XDP aggregator is covered by tests/e2e.
#include "xagg/communicator.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "cell_rules.h"
#include "control_messages.h"
#include "pipeline.h"
#include "shard_placement.h"
#include "xagg/quantize.h"
#include "unique_fd.h"
#include "wire.h"

namespace xagg {
namespace {

using namespace std::chrono_literals;
using xagg::UniqueFd;

sockaddr_in loopback(uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  return address;
}

// A socket bound to 127.0.0.1 on a port the kernel picked.
UniqueFd bound_socket(int type, uint16_t& port) {
  UniqueFd fd(::socket(AF_INET, type | SOCK_CLOEXEC, 0));
  sockaddr_in address = loopback(0);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length);
  port = ntohs(address.sin_port);
  return fd;
}

uint16_t unused_port(int type) {
  uint16_t port = 0;
  bound_socket(type, port);
  return port;
}

bool readable(int fd, std::chrono::milliseconds timeout) {
  pollfd entry{fd, POLLIN, 0};
  return ::poll(&entry, 1, static_cast<int>(timeout.count())) > 0;
}

struct AggregatorBehaviour {
  bool never_start = false;  // reply to joins but never send Start
  bool drop_data = false;    // accept no DATA at all
  uint32_t drop_every_nth_result = 0;
  uint32_t shorten_every_nth_result = 0;  // send it one element short instead
  std::string refuse_join = {};  // non-empty: answer the join with this Error
  uint32_t start_chunks = 0;     // non-zero: size the job wrongly in Start
  uint32_t start_chunk_elements = 0;  // non-zero: a chunk size that does not match the MTU
  uint32_t wire_bits = 32;            // the ranks' CommunicatorConfig::wire_bits
};

class LoopbackAggregator {
 public:
  LoopbackAggregator(uint32_t world_size, AggregatorBehaviour behaviour = {})
      : world_size_(world_size),
        behaviour_(std::move(behaviour)),
        listener_(bound_socket(SOCK_STREAM, control_port_)),
        data_socket_(bound_socket(SOCK_DGRAM, data_port_)) {
    ::listen(listener_.get(), 64);
    for (uint32_t rank = 0; rank < world_size; ++rank) result_ports_.push_back(unused_port(SOCK_DGRAM));
    control_thread_ = std::jthread([this](std::stop_token stop) { serve_control(stop); });
    data_thread_ = std::jthread([this](std::stop_token stop) { serve_data(stop); });
  }

  CommunicatorConfig config(uint32_t rank, uint64_t max_elements) const {
    CommunicatorConfig config;
    config.aggregators = {"127.0.0.1"};
    config.control_port = control_port_;
    config.job_id = kJobId;
    config.rank = rank;
    config.world_size = world_size_;
    config.max_elements = max_elements;
    config.join_timeout = 5s;
    config.operation_timeout = 10s;
    config.retransmit_interval = 20ms;
    config.window_chunks = 16;
    config.wire_bits = behaviour_.wire_bits;
    return config;
  }

  // This aggregator as an entry of CommunicatorConfig::aggregators.
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(control_port_); }
  // Distinct chunks (its own indexes) that had DATA, over every iteration tag.
  size_t chunks_with_data() const {
    std::lock_guard lock(chunks_mutex_);
    std::set<uint32_t> chunks;
    for (const auto& [iteration, seen] : chunks_by_iteration_) chunks.insert(seen.begin(), seen.end());
    return chunks.size();
  }
  uint32_t job_chunks() const { return chunks_; }
  uint32_t chunk_elements() const { return chunk_elements_; }

  void report_error(const std::string& message) {
    std::lock_guard lock(connections_mutex_);
    for (auto& connection : connections_) send_line(connection.get(), control::Error{message});
  }

  uint64_t results_dropped() const { return results_dropped_; }
  uint64_t results_shortened() const { return results_shortened_; }
  // SUM DATA that came while some MAX (exponent) chunk still waited for a rank.
  uint64_t values_ahead_of_exponents() const { return values_ahead_of_exponents_; }
  // Distinct chunks that had DATA before the first result went out.
  size_t chunks_before_first_result() const { return chunks_before_first_result_; }

  // Waits until DATA of `count` distinct chunks with this iteration tag has
  // come: a rank that calls it holds back until the others have sent that
  // much. False after 10 s.
  bool wait_for_chunks(uint32_t iteration, size_t count) {
    std::unique_lock lock(chunks_mutex_);
    return chunks_arrived_.wait_for(lock, 10s, [&] { return chunks_by_iteration_[iteration].size() >= count; });
  }

 private:
  static constexpr uint32_t kJobId = 7;
  static constexpr uint64_t kToken = 0x0123456789abcdefull;

  struct LoopbackCell {
    control::Cell cell;
    std::vector<int32_t> value;  // the job's chunk_elements
  };

  static void send_line(int fd, const control::Message& message) {
    std::string line = control::encode(message) + "\n";
    ::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
  }

  void serve_control(std::stop_token stop) {
    std::vector<uint32_t> joined_ranks;
    uint32_t mtu = UINT16_MAX;
    uint64_t elements = 0;
    std::vector<uint32_t> weights;
    uint32_t shard = 0;
    uint32_t wire_bits = wire::kWideBits;
    while (!stop.stop_requested() && joined_ranks.size() < world_size_) {
      if (!readable(listener_.get(), 20ms)) continue;
      UniqueFd connection(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!readable(connection.get(), 2s)) continue;
      char buffer[control::kMaxLineBytes];
      ssize_t length = ::recv(connection.get(), buffer, sizeof(buffer), 0);
      if (length <= 0) continue;
      auto join = std::get<control::JoinRequest>(control::decode({buffer, static_cast<size_t>(length) - 1}));
      if (!behaviour_.refuse_join.empty()) {
        send_line(connection.get(), control::Error{behaviour_.refuse_join});
        continue;
      }
      // Sized as the real aggregator does (protocol.md sections 1 and 6), once every rank has joined.
      mtu = std::min(mtu, join.mtu);
      elements = join.elements;
      weights = join.weights;
      shard = join.shard;
      wire_bits = join.wire_bits;
      send_line(connection.get(), control::JoinReply{kToken, data_port_, result_ports_[join.rank], "127.0.0.1"});
      std::lock_guard lock(connections_mutex_);
      connections_.push_back(std::move(connection));
      joined_ranks.push_back(join.rank);
    }
    if (behaviour_.never_start) return;
    const uint32_t chunk_elements = wire::chunk_elements_for(mtu, wire_bits);
    const uint32_t job_chunks = wire::layout_for(elements, chunk_elements).total();
    chunks_ = weights.empty() ? job_chunks : ShardPlacement(weights, job_chunks).shard_chunks(shard);
    chunk_elements_ = chunk_elements;
    control::Start start{mtu, behaviour_.start_chunk_elements ? behaviour_.start_chunk_elements : chunk_elements,
                         behaviour_.start_chunks ? behaviour_.start_chunks : chunks_.load()};
    start.wire_bits = wire_bits;
    {
      std::lock_guard lock(connections_mutex_);
      for (auto& connection : connections_) send_line(connection.get(), start);
    }
    answer_pings(stop);
  }

  // Answers the ranks' heartbeats, as the daemon does; every other line stays
  // unanswered (status questions too: the tests of unknown answers need that).
  void answer_pings(std::stop_token stop) {
    std::map<int, std::string> received;
    while (!stop.stop_requested()) {
      std::this_thread::sleep_for(5ms);
      std::lock_guard lock(connections_mutex_);
      for (auto& connection : connections_) {
        char buffer[4096];
        ssize_t length = ::recv(connection.get(), buffer, sizeof(buffer), MSG_DONTWAIT);
        if (length <= 0) continue;
        std::string& lines = received[connection.get()];
        lines.append(buffer, static_cast<size_t>(length));
        for (size_t end; (end = lines.find('\n')) != std::string::npos; lines.erase(0, end + 1))
          if (lines.compare(0, end, control::encode(control::Ping{})) == 0) send_line(connection.get(), control::Pong{});
      }
    }
  }

  void send_result(std::vector<std::byte>& packet, uint32_t rank, uint8_t flags) {
    any_result_sent_ = true;
    ++results_sent_;
    if (behaviour_.drop_every_nth_result && results_sent_ % behaviour_.drop_every_nth_result == 0) {
      ++results_dropped_;
      return;
    }
    size_t bytes = packet.size();
    if (behaviour_.shorten_every_nth_result && results_sent_ % behaviour_.shorten_every_nth_result == 0) {
      ++results_shortened_;
      bytes -= sizeof(int32_t);
    }
    wire::Header header = *wire::decode_packet(packet).header;
    header.type = wire::MsgType::Result;
    header.flags = flags | (header.flags & wire::kFlagNarrow);
    wire::encode_header(header, packet);
    sockaddr_in destination = loopback(result_ports_[rank]);
    ::sendto(data_socket_.get(), packet.data(), bytes, 0, reinterpret_cast<sockaddr*>(&destination),
             sizeof(destination));
  }

  // The cell semantics of bpf/xagg_aggregator.bpf.c.
  void serve_data(std::stop_token stop) {
    std::map<uint32_t, LoopbackCell> cells;
    std::set<uint32_t> chunks_seen;
    const uint64_t full_mask = wire::all_ranks_mask(world_size_);
    std::vector<std::byte> packet(wire::kPacketBytes + 1);
    while (!stop.stop_requested()) {
      if (!readable(data_socket_.get(), 20ms)) continue;
      ssize_t length = ::recv(data_socket_.get(), packet.data(), packet.size(), 0);
      if (length <= 0 || behaviour_.drop_data) continue;
      std::vector<std::byte> data(packet.begin(), packet.begin() + length);
      const wire::Decoded decoded = wire::decode_packet(data);
      const auto& header = decoded.header;
      if (!header || header->token != kToken || header->chunk >= chunks_) continue;
      {
        std::lock_guard lock(chunks_mutex_);
        if (chunks_by_iteration_[header->iteration].insert(header->chunk).second) chunks_arrived_.notify_all();
      }
      if (!any_result_sent_) {
        chunks_seen.insert(header->chunk);
        chunks_before_first_result_ = chunks_seen.size();
      }
      if (header->op == wire::ElemOp::Sum &&
          std::ranges::any_of(cells, [&](const auto& entry) {
            return entry.second.cell.op == XAGG_OP_MAX && entry.second.cell.arrived != full_mask;
          }))
        ++values_ahead_of_exponents_;
      // The aggregators' own cell rules (control::merge), 16-bit lanes included.
      LoopbackCell& cell = cells[header->chunk * 2 + (header->iteration & 1)];
      cell.value.resize(chunk_elements_);
      control::CellResult result;
      const control::Outcome outcome =
          control::merge(cell.cell, cell.value, {data.data(), decoded.elements, decoded.narrow()}, *header,
                         {full_mask, static_cast<uint32_t>(quant::ceil_log2(world_size_))}, false, result);
      if (outcome == control::Outcome::Resend) send_result(data, header->rank, XAGG_FLAG_RESEND);
      if (outcome != control::Outcome::Completed) continue;
      for (uint32_t rank = 0; rank < world_size_; ++rank) send_result(data, rank, 0);
    }
  }

  const uint32_t world_size_;
  std::atomic<uint32_t> chunks_ = 0;
  std::atomic<uint32_t> chunk_elements_ = 0;
  const AggregatorBehaviour behaviour_;
  uint16_t control_port_ = 0;
  uint16_t data_port_ = 0;
  UniqueFd listener_;
  UniqueFd data_socket_;
  std::vector<uint16_t> result_ports_;
  std::mutex connections_mutex_;
  std::vector<UniqueFd> connections_;
  uint64_t results_sent_ = 0;
  bool any_result_sent_ = false;
  std::atomic<uint64_t> results_dropped_ = 0;
  std::atomic<uint64_t> results_shortened_ = 0;
  std::atomic<uint64_t> values_ahead_of_exponents_ = 0;
  std::atomic<size_t> chunks_before_first_result_ = 0;
  mutable std::mutex chunks_mutex_;
  std::condition_variable chunks_arrived_;
  std::map<uint32_t, std::set<uint32_t>> chunks_by_iteration_;  // chunks that had DATA, by iteration tag
  std::jthread control_thread_;
  std::jthread data_thread_;
};

CommunicatorConfig valid_config(uint16_t control_port) {
  CommunicatorConfig config;
  config.aggregators = {"127.0.0.1"};
  config.control_port = control_port;
  config.job_id = 1;
  config.rank = 0;
  config.world_size = 2;
  config.max_elements = 1000;
  return config;
}

struct BadConfig {
  const char* name;
  void (*spoil)(CommunicatorConfig&);
  const char* field;
};

class CommunicatorConfigError : public ::testing::TestWithParam<BadConfig> {};

TEST_P(CommunicatorConfigError, IsThrownBeforeAnyConnection) {
  uint16_t port = 0;
  UniqueFd listener = bound_socket(SOCK_STREAM, port);
  ASSERT_EQ(::listen(listener.get(), 4), 0);
  CommunicatorConfig config = valid_config(port);
  GetParam().spoil(config);
  try {
    Communicator communicator(config);
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find(GetParam().field), std::string::npos) << error.what();
  }
  EXPECT_FALSE(readable(listener.get(), 0ms)) << "a connection was attempted";
}

INSTANTIATE_TEST_SUITE_P(
    EveryField, CommunicatorConfigError,
    ::testing::Values(
        BadConfig{"empty_aggregator", [](CommunicatorConfig& c) { c.aggregators.clear(); }, "aggregators is empty"},
        BadConfig{"hostname_aggregator", [](CommunicatorConfig& c) { c.aggregators = {"localhost"}; }, "aggregator"},
        BadConfig{"world_size_zero", [](CommunicatorConfig& c) { c.world_size = 0; }, "world_size"},
        BadConfig{"world_size_65", [](CommunicatorConfig& c) { c.world_size = 65; }, "world_size"},
        BadConfig{"rank_equal_world", [](CommunicatorConfig& c) { c.rank = 2; }, "rank"},
        BadConfig{"max_elements_zero", [](CommunicatorConfig& c) { c.max_elements = 0; }, "max_elements"},
        BadConfig{"max_elements_huge", [](CommunicatorConfig& c) { c.max_elements = ~0ull; }, "max_elements"},
        BadConfig{"join_timeout", [](CommunicatorConfig& c) { c.join_timeout = 0ms; }, "join_timeout"},
        BadConfig{"operation_timeout", [](CommunicatorConfig& c) { c.operation_timeout = -1ms; },
                  "operation_timeout"},
        BadConfig{"retransmit_interval", [](CommunicatorConfig& c) { c.retransmit_interval = 0ms; },
                  "retransmit_interval"},
        BadConfig{"window_chunks", [](CommunicatorConfig& c) { c.window_chunks = 0; }, "window_chunks"},
        // Limits: beyond them deadlines overflow the clock or the window allocates gigabytes.
        BadConfig{"join_timeout_day", [](CommunicatorConfig& c) { c.join_timeout = 24h + 1ms; }, "join_timeout"},
        BadConfig{"operation_timeout_day", [](CommunicatorConfig& c) { c.operation_timeout = 24h + 1ms; },
                  "operation_timeout"},
        BadConfig{"operation_timeout_max",
                  [](CommunicatorConfig& c) { c.operation_timeout = std::chrono::milliseconds::max(); },
                  "operation_timeout"},
        BadConfig{"retransmit_interval_day", [](CommunicatorConfig& c) { c.retransmit_interval = 24h + 1ms; },
                  "retransmit_interval"},
        BadConfig{"window_chunks_65537", [](CommunicatorConfig& c) { c.window_chunks = 65537; }, "window_chunks"},
        BadConfig{"window_chunks_max", [](CommunicatorConfig& c) { c.window_chunks = UINT32_MAX; },
                  "window_chunks"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Communicator, JoinToAClosedPortFailsQuickly) {
  CommunicatorConfig config = valid_config(unused_port(SOCK_STREAM));
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(Communicator communicator(config), CommError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
}

TEST(Communicator, ValuesAtTheLimitsPassValidation) {
  CommunicatorConfig config = valid_config(unused_port(SOCK_STREAM));
  config.join_timeout = 24h;
  config.operation_timeout = 24h;
  config.retransmit_interval = 24h;
  config.window_chunks = 65536;
  EXPECT_THROW(Communicator communicator(config), CommError);  // connection refused, not a ConfigError
}

TEST(Communicator, RefusedJoinIsAConfigError) {
  LoopbackAggregator aggregator(1, {.refuse_join = "job 7: world_size differs"});
  try {
    Communicator communicator(aggregator.config(0, 100));
    ADD_FAILURE() << "joined";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("world_size differs"), std::string::npos) << error.what();
    // The aggregator counts max_elements plus the slack: say so, or its numbers puzzle.
    EXPECT_NE(std::string(error.what()).find("max_elements 100 plus 131072 of placement slack"), std::string::npos)
        << error.what();
  }
}

TEST(Communicator, StartSizingTheJobWronglyIsRefused) {
  // 4e9 chunks would make the per-chunk state take tens of gigabytes.
  LoopbackAggregator aggregator(1, {.start_chunks = 4000000000u});
  try {
    Communicator communicator(aggregator.config(0, 100));
    ADD_FAILURE() << "joined";
  } catch (const CommError& error) {
    EXPECT_NE(std::string(error.what()).find("holds 4000000000 chunks"), std::string::npos) << error.what();
  }
}

TEST(Communicator, JoinWithoutStartTimesOut) {
  LoopbackAggregator aggregator(1, {.never_start = true});
  CommunicatorConfig config = aggregator.config(0, 100);
  config.join_timeout = 300ms;
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(Communicator communicator(config), TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

// Runs one Communicator per rank on its own thread; mtus: each rank's MTU (none: the path MTU).
template <class Body>
void run_ranks(LoopbackAggregator& aggregator, uint32_t world_size, uint64_t max_elements, Body body,
               std::vector<uint32_t> mtus = {}) {
  std::vector<std::jthread> threads;
  std::vector<std::string> failures(world_size);
  for (uint32_t rank = 0; rank < world_size; ++rank)
    threads.emplace_back([&, rank] {
      try {
        CommunicatorConfig config = aggregator.config(rank, max_elements);
        if (!mtus.empty()) config.mtu = mtus[rank];
        Communicator communicator(config);
        body(communicator, rank);
      } catch (const std::exception& error) {
        failures[rank] = error.what();
      }
    });
  threads.clear();
  for (uint32_t rank = 0; rank < world_size; ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
}

// Ranks with different MTUs agree on the smallest; its chunk size carries every element.
TEST(Communicator, RanksAgreeOnTheSmallestMtuAndItsChunkSize) {
  constexpr uint32_t kRanks = 3;
  constexpr size_t kElements = 360 * 50 + 7;
  LoopbackAggregator aggregator(kRanks, {.drop_every_nth_result = 13});
  run_ranks(
      aggregator, kRanks, kElements,
      [&](Communicator& communicator, uint32_t rank) {
        EXPECT_EQ(communicator.mtu(), 1500u);
        EXPECT_EQ(communicator.chunk_elements(), 360u);
        std::vector<int32_t> values(kElements);
        for (size_t i = 0; i < kElements; ++i) values[i] = static_cast<int32_t>(i * (rank + 1));
        std::vector<float> floats(kElements, 0.25f * static_cast<float>(rank + 1));
        communicator.allreduce(values.data(), values.size());
        communicator.allreduce(floats.data(), floats.size());
        for (size_t i = 0; i < kElements; ++i) {
          ASSERT_EQ(values[i], static_cast<int32_t>(i * 6)) << "element " << i;
          ASSERT_NEAR(floats[i], 1.5f, 1e-5) << "element " << i;
        }
      },
      {9000, 1500, 4000});
  EXPECT_EQ(aggregator.chunk_elements(), 360u);
  EXPECT_GT(aggregator.job_chunks(), wire::layout_for(kElements, 360).total());
  EXPECT_GT(aggregator.results_dropped(), 0u);
}

// A chunk size that is not the MTU's would make ranks and aggregator cut the tensor differently.
TEST(Communicator, StartWithAChunkSizeThatDoesNotFitTheMtuIsRefused) {
  LoopbackAggregator aggregator(1, {.start_chunk_elements = 2048});
  CommunicatorConfig config = aggregator.config(0, 100);
  config.mtu = 1500;
  try {
    Communicator communicator(config);
    ADD_FAILURE() << "joined";
  } catch (const CommError& error) {
    EXPECT_NE(std::string(error.what()).find("gives 2048 elements per chunk for MTU 1500, not 360"), std::string::npos)
        << error.what();
  }
}

TEST(Communicator, RefusesAnMtuBelowTheMinimum) {
  CommunicatorConfig config = valid_config(9);
  config.mtu = 1200;
  try {
    Communicator communicator(config);
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("mtu 1200 is not in 1280..65535"), std::string::npos) << error.what();
  }
}

TEST(Communicator, AllReducesFloatsAndIntsDespiteLostResults) {
  constexpr uint32_t kRanks = 3;
  constexpr size_t kElements = wire::kChunkElems * 40 + 5;  // more chunks than the window, a partial last one
  LoopbackAggregator aggregator(kRanks, {.drop_every_nth_result = 7});
  auto input = [](uint32_t rank, size_t i) { return std::sin(0.001f * i) * (rank + 1) * 100.0f; };
  // |input| < 2^9, the exponent used may be predicted up to kMaxExponentExcess
  // higher; half a float ulp of the result comes on top of the bound.
  const double tolerance = quant::error_bound(9 + quant::kMaxExponentExcess, kRanks) / kRanks + std::ldexp(1.0, 8 - 24);
  run_ranks(aggregator, kRanks, kElements, [&](Communicator& communicator, uint32_t rank) {
    EXPECT_EQ(communicator.rank(), rank);
    EXPECT_EQ(communicator.world_size(), kRanks);
    for (int round = 0; round < 3; ++round) {
      std::vector<float> values(kElements);
      for (size_t i = 0; i < kElements; ++i) values[i] = input(rank, i);
      communicator.allreduce(values.data(), values.size(), ReduceOp::Average);
      for (size_t i = 0; i < kElements; ++i) {
        double expected = (double{input(0, i)} + input(1, i) + input(2, i)) / kRanks;
        ASSERT_NEAR(values[i], expected, tolerance) << "element " << i;
      }
      std::vector<int32_t> counts(kElements, static_cast<int32_t>(rank) - 5);
      std::vector<int32_t> partial(100, 1);
      auto work = communicator.allreduce_async(counts.data(), counts.size(), ReduceOp::Average);
      communicator.allreduce(partial.data(), partial.size());
      EXPECT_TRUE(work->completed());
      work->wait();
      EXPECT_EQ(counts.front(), -4);  // (-5 - 4 - 3) / 3
      EXPECT_EQ(counts.back(), -4);
      EXPECT_EQ(partial[99], 3);
    }
  });
  EXPECT_GT(aggregator.results_dropped(), 0u);
}

// Rank 1 starts once rank 0 has sent every bucket of the first step, not just
// the first bucket (they take side-by-side chunk ranges); every step's results
// are exact and the Works complete in call order.
// MAX exactly and MIN as the MAX of complements, also at int32's extremes;
// float32 within half a quantization step.
TEST(Communicator, MaxAndMinOfIntsAndFloats) {
  constexpr uint32_t kRanks = 3;
  constexpr size_t kElements = wire::kChunkElems * 3 + 7;
  LoopbackAggregator aggregator(kRanks);
  auto input = [](uint32_t rank, size_t i) { return std::cos(0.01f * i + rank) * 50.0f; };
  const double tolerance = quant::error_bound(6 + quant::kMaxExponentExcess, kRanks) / kRanks;
  run_ranks(aggregator, kRanks, kElements, [&](Communicator& communicator, uint32_t rank) {
    for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min}) {
      std::vector<int32_t> ints(kElements, static_cast<int32_t>(rank) * 7 - 3);
      ints.front() = rank == 0 ? INT32_MIN : 0;
      ints.back() = rank == 2 ? INT32_MAX : -1;
      communicator.allreduce(ints.data(), ints.size(), op);
      EXPECT_EQ(ints[1], op == ReduceOp::Max ? 11 : -3);
      EXPECT_EQ(ints.front(), op == ReduceOp::Max ? 0 : INT32_MIN);
      EXPECT_EQ(ints.back(), op == ReduceOp::Max ? INT32_MAX : -1);
      std::vector<float> floats(kElements);
      for (size_t i = 0; i < kElements; ++i) floats[i] = input(rank, i);
      communicator.allreduce(floats.data(), floats.size(), op);
      for (size_t i = 0; i < kElements; ++i) {
        float expected = input(0, i);
        for (uint32_t r = 1; r < kRanks; ++r)
          expected = op == ReduceOp::Max ? std::max(expected, input(r, i)) : std::min(expected, input(r, i));
        ASSERT_NEAR(floats[i], expected, tolerance) << "element " << i;
      }
    }
  });
}

// NaN and Inf come out element-exact by IEEE rules under every op, and every
// finite element of their chunks within the bound; three steps, so that the
// chunks go the predicted way too, and a finite step after them is right.
TEST(Communicator, NonFiniteValuesAreElementExact) {
  constexpr uint32_t kRanks = 3;
  constexpr size_t kElements = wire::kChunkElems * 2 + 9;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  LoopbackAggregator aggregator(kRanks, {.drop_every_nth_result = 5});
  // Per element and rank: NaN at 5 on rank 0; +Inf at 2050 on rank 1; +Inf
  // and -Inf at 2051 on ranks 0 and 2; -Inf at 4100 on every rank; -Inf at
  // 4101 on rank 1 only.
  auto input = [&](uint32_t rank, size_t i, int step) -> float {
    if (step < 2) {
      if (i == 5 && rank == 0) return NAN;
      if (i == 2050 && rank == 1) return kInf;
      if (i == 2051 && rank != 1) return rank == 0 ? kInf : -kInf;
      if (i == 4100 || (i == 4101 && rank == 1)) return -kInf;
    }
    return std::sin(0.003f * i + rank) * 40.0f;
  };
  const double tolerance = quant::error_bound(6 + quant::kMaxExponentExcess, kRanks) + std::ldexp(1.0, 6 - 24);
  run_ranks(aggregator, kRanks, kElements, [&](Communicator& communicator, uint32_t rank) {
    for (int step = 0; step < 3; ++step)
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average, ReduceOp::Max, ReduceOp::Min}) {
        std::vector<float> values(kElements);
        for (size_t i = 0; i < kElements; ++i) values[i] = input(rank, i, step);
        communicator.allreduce(values.data(), values.size(), op);
        for (size_t i = 0; i < kElements; ++i) {
          // IEEE in double: NaN propagates, Inf - Inf is NaN; max/min with NaN is NaN.
          double expected = input(0, i, step);
          for (uint32_t r = 1; r < kRanks; ++r) {
            double x = input(r, i, step);
            if (std::isnan(x) || std::isnan(expected))
              expected = NAN;
            else if (op == ReduceOp::Max)
              expected = std::max(expected, x);
            else if (op == ReduceOp::Min)
              expected = std::min(expected, x);
            else
              expected += x;
          }
          if (op == ReduceOp::Average) expected /= kRanks;
          SCOPED_TRACE(testing::Message() << "step " << step << " op " << static_cast<int>(op) << " element " << i);
          if (!std::isfinite(expected))
            ASSERT_TRUE(std::isnan(expected) ? std::isnan(values[i]) : values[i] == expected) << values[i];
          else
            ASSERT_NEAR(values[i], expected, tolerance);
        }
      }
  });
}

// The 16-bit wire (protocol.md section 11) through libxagg: every finite
// element within its bound against a float64 reference, NaN and Inf
// element-exact (the kinds as OR bits) under every op, over three steps (the
// predicted way too), with lost results; twice the elements per packet, and
// int32 refused with a message.
// A width for the job (CommunicatorConfig::wire_bits) and one for its float32 all-reduces.
struct Widths {
  uint32_t job;
  uint32_t operation;  // 0: the job's
};

class NarrowWire : public testing::TestWithParam<Widths> {};

// 16-bit all-reduces on a 16-bit job (full packets) and on a 32-bit one (half
// packets), and 32-bit ones on a 16-bit job: each keeps its own bound, and
// int32 goes exact on either job.
TEST_P(NarrowWire, KeepsItsBoundAndNonFiniteValuesExact) {
  constexpr uint32_t kRanks = 3;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const Widths widths = GetParam();
  const bool narrow = (widths.operation ? widths.operation : widths.job) == wire::kNarrowBits;
  LoopbackAggregator aggregator(kRanks, {.drop_every_nth_result = 5, .wire_bits = widths.job});
  const size_t elements = wire::kMaxChunkElems * 2 + 9;
  auto input = [&](uint32_t rank, size_t i, int step) -> float {
    if (step < 2) {
      if (i == 5 && rank == 0) return NAN;
      if (i == 4100 && rank == 1) return kInf;
      if (i == 4101 && rank != 1) return rank == 0 ? kInf : -kInf;
      if (i == 8200 || (i == 8201 && rank == 1)) return -kInf;
    }
    return std::sin(0.003f * i + rank) * 40.0f * (i % 7 == 0 ? 1e-3f : 1.0f);
  };
  // max_elements of the job's width: a 32-bit all-reduce on a 16-bit job holds half.
  const size_t max_elements = widths.job == wire::kNarrowBits && !narrow ? 2 * elements : elements;
  run_ranks(aggregator, kRanks, max_elements, [&](Communicator& communicator, uint32_t rank) {
    EXPECT_EQ(communicator.wire_bits(), widths.job);
    const uint32_t wide_chunk = wire::chunk_elements_for(communicator.mtu());
    EXPECT_EQ(communicator.chunk_elements(), widths.job == wire::kNarrowBits ? 2 * wide_chunk : wide_chunk);
    std::vector<int32_t> integers(4, 1 << 20);
    communicator.allreduce(integers.data(), integers.size());
    EXPECT_EQ(integers, std::vector<int32_t>(4, kRanks << 20));
    std::vector<float> too_many(max_elements + 1);
    EXPECT_THROW(communicator.allreduce(too_many.data(), too_many.size(), ReduceOp::Sum, widths.operation),
                 ConfigError);
    EXPECT_THROW(communicator.allreduce(too_many.data(), 1, ReduceOp::Sum, 24), ConfigError);
    // A chunk's elements share their exponent: the job's chunk, or the wide one.
    const size_t chunk = narrow && widths.job == wire::kNarrowBits ? 2 * wide_chunk : wide_chunk;
    for (int step = 0; step < 3; ++step)
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average, ReduceOp::Max, ReduceOp::Min}) {
        communicator.begin_step();
        std::vector<float> values(elements);
        for (size_t i = 0; i < elements; ++i) values[i] = input(rank, i, step);
        communicator.allreduce(values.data(), values.size(), op, widths.operation);
        std::vector<float> chunk_largest((elements + chunk - 1) / chunk, 0.0f);
        for (size_t j = 0; j < elements; ++j)
          for (uint32_t r = 0; r < kRanks; ++r)
            if (std::isfinite(input(r, j, step)))
              chunk_largest[j / chunk] = std::max(chunk_largest[j / chunk], std::fabs(input(r, j, step)));
        for (size_t i = 0; i < elements; ++i) {
          double expected = input(0, i, step);
          for (uint32_t r = 1; r < kRanks; ++r) {
            double x = input(r, i, step);
            if (std::isnan(x) || std::isnan(expected))
              expected = NAN;
            else if (op == ReduceOp::Max)
              expected = std::max(expected, x);
            else if (op == ReduceOp::Min)
              expected = std::min(expected, x);
            else
              expected += x;
          }
          if (op == ReduceOp::Average) expected /= kRanks;
          SCOPED_TRACE(testing::Message() << "step " << step << " op " << static_cast<int>(op) << " element " << i);
          if (!std::isfinite(expected)) {
            ASSERT_TRUE(std::isnan(expected) ? std::isnan(values[i]) : values[i] == expected) << values[i];
            continue;
          }
          // The bound for the exponent its chunk's values may use (a held prediction: up to 4 above).
          const int32_t exponent = quant::chunk_exponent({&chunk_largest[i / chunk], 1}) + quant::kMaxExponentExcess;
          const int value_bits = narrow ? quant::kNarrowValueBits : quant::scale_bits(kRanks);
          const double sum_bound = narrow ? quant::narrow_error_bound(exponent, kRanks, 0)
                                          : quant::error_bound(exponent, kRanks);
          const double bound = (op == ReduceOp::Max || op == ReduceOp::Min)
                                   ? std::ldexp(1.0, exponent - value_bits - 1)
                                   : sum_bound / (op == ReduceOp::Average ? kRanks : 1);
          ASSERT_LE(std::fabs(values[i] - expected), bound + std::ldexp(std::fabs(expected), -24)) << values[i];
        }
      }
  });
  EXPECT_GT(aggregator.results_dropped(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Widths, NarrowWire,
                         testing::Values(Widths{16, 0}, Widths{32, 16}, Widths{16, 32}),
                         [](const testing::TestParamInfo<Widths>& info) {
                           const uint32_t operation = info.param.operation ? info.param.operation : info.param.job;
                           return "job" + std::to_string(info.param.job) + "_allreduce" + std::to_string(operation);
                         });

// One 1e6 element among N(0,1) values: on the 16-bit wire it costs the
// precision of its block's 31 other elements alone (docs/protocol.md section
// 11, item 7); every other element keeps the bound of its own block's values.
// Measured through the whole path, against a float64 reference; printed.
TEST(Communicator, AnOutlierOnTheNarrowWireCostsOnlyItsBlock) {
  constexpr uint32_t kRanks = 4;
  constexpr size_t kOutlier = 100;
  LoopbackAggregator aggregator(kRanks, {.wire_bits = 16});
  const size_t elements = 3 * wire::kMaxChunkElems;
  std::vector<std::vector<float>> inputs(kRanks, std::vector<float>(elements));
  std::mt19937 rng(35);
  for (auto& values : inputs) std::ranges::generate(values, [&] { return std::normal_distribution<float>()(rng); });
  inputs[0][kOutlier] = 1e6f;
  auto input = [&](uint32_t rank, size_t i) { return inputs[rank][i]; };
  std::vector<double> exact(elements);
  for (size_t i = 0; i < elements; ++i)
    for (uint32_t rank = 0; rank < kRanks; ++rank) exact[i] += input(rank, i);
  std::vector<std::vector<float>> results(kRanks);
  run_ranks(aggregator, kRanks, elements, [&](Communicator& communicator, uint32_t rank) {
    std::vector<float> values(elements);
    for (size_t i = 0; i < elements; ++i) values[i] = input(rank, i);
    communicator.allreduce(values.data(), values.size());
    results[rank] = std::move(values);
  });
  const size_t block = kOutlier / wire::kNarrowBlockElems;
  double in_block = 0, elsewhere = 0, elsewhere_bound = 0;
  for (size_t i = 0; i < elements; ++i) {
    if (i == kOutlier) continue;
    const double error = std::fabs(results[0][i] - exact[i]);
    if (i / wire::kNarrowBlockElems == block) {
      in_block = std::max(in_block, error);
      continue;
    }
    // The bound of the block's own largest input (a first use: no prediction).
    float largest = 0;
    const size_t first = i / wire::kNarrowBlockElems * wire::kNarrowBlockElems;
    for (size_t j = first; j < std::min(elements, first + wire::kNarrowBlockElems); ++j)
      for (uint32_t rank = 0; rank < kRanks; ++rank) largest = std::max(largest, std::fabs(input(rank, j)));
    const double bound = quant::narrow_error_bound(quant::chunk_exponent({&largest, 1}), kRanks, 0);
    ASSERT_LE(error, bound + std::ldexp(std::fabs(exact[i]), -24)) << "element " << i;
    elsewhere = std::max(elsewhere, error);
    elsewhere_bound = std::max(elsewhere_bound, bound);
  }
  for (uint32_t rank = 1; rank < kRanks; ++rank) EXPECT_EQ(results[rank], results[0]);
  std::printf("one 1e6 outlier among N(0,1) values, 4 ranks, 16-bit wire: largest error %.3e in its block of %u, "
              "%.3e elsewhere (bound %.3e)\n",
              in_block, wire::kNarrowBlockElems, elsewhere, elsewhere_bound);
  EXPECT_LT(elsewhere, 0.01);
}

TEST(Communicator, AStepsBucketsAreAllInFlightAtOnce) {
  const std::vector<size_t> buckets = {wire::kChunkElems * 3 + 5, wire::kChunkElems * 2, 100};
  const size_t total = wire::kChunkElems * 5 + 105;
  LoopbackAggregator aggregator(2);
  run_ranks(aggregator, 2, total, [&](Communicator& communicator, uint32_t rank) {
    // The three int32 buckets have 4 + 2 + 1 chunks.
    if (rank == 1) {
      EXPECT_TRUE(aggregator.wait_for_chunks(0, 7)) << "rank 0 held buckets back";
    }
    for (int32_t step = 0; step < 3; ++step) {
      communicator.begin_step();
      std::vector<std::vector<int32_t>> data;
      std::vector<std::shared_ptr<Work>> works;
      for (size_t count : buckets) data.emplace_back(count, step * 10 + static_cast<int32_t>(rank) + 1);
      for (auto& bucket : data) works.push_back(communicator.allreduce_async(bucket.data(), bucket.size()));
      works.back()->wait();
      for (auto& work : works) EXPECT_TRUE(work->completed());
      for (auto& bucket : data)
        for (int32_t value : bucket) ASSERT_EQ(value, 2 * step * 10 + 3);
    }
  });
  EXPECT_EQ(aggregator.chunks_before_first_result(), 7u);
}

// A RESULT must carry as many elements as the chunk it answers: a shorter one
// is ignored, as if lost, and the chunk's resend brings the whole result.
TEST(Communicator, ResultsOfTheWrongLengthAreIgnored) {
  constexpr uint32_t kRanks = 2;
  constexpr size_t kElements = wire::kChunkElems * 6 + 100;  // a partial last chunk
  LoopbackAggregator aggregator(kRanks, {.shorten_every_nth_result = 3});
  run_ranks(aggregator, kRanks, kElements, [&](Communicator& communicator, uint32_t rank) {
    for (int round = 0; round < 3; ++round) {
      std::vector<int32_t> values(kElements);
      for (size_t i = 0; i < kElements; ++i) values[i] = static_cast<int32_t>(i * (rank + 1) + round);
      communicator.allreduce(values.data(), values.size());
      for (size_t i = 0; i < kElements; ++i)
        ASSERT_EQ(values[i], static_cast<int32_t>(i * 3 + 2 * round)) << "round " << round << " element " << i;
    }
  });
  EXPECT_GT(aggregator.results_shortened(), 0u);
}

TEST(Communicator, TimeoutNamesTheResultsItIgnored) {
  LoopbackAggregator aggregator(1, {.shorten_every_nth_result = 1});
  CommunicatorConfig config = aggregator.config(0, wire::kChunkElems * 2);
  config.operation_timeout = 200ms;
  Communicator communicator(config);
  std::vector<int32_t> values(wire::kChunkElems * 2, 1);
  try {
    communicator.allreduce(values.data(), values.size());
    ADD_FAILURE() << "completed on short results";
  } catch (const TimeoutError& error) {
    EXPECT_NE(std::string(error.what()).find("results ignored: 0 undecodable, "), std::string::npos) << error.what();
    EXPECT_EQ(std::string(error.what()).find(", 0 of another op or length"), std::string::npos) << error.what();
  }
}

// From the second step on, a bucket's values go out with exponents predicted
// from the step before: rank 1 starts step 1 only once rank 0 has filled its
// window with it, so rank 0's values reach the aggregator while the exponents
// still wait for rank 1. Then magnitudes jump up and down, the predictions
// fail, every rank redoes those chunks (some results are lost on the way), and
// every result stays within the bound.
TEST(Communicator, PredictedExponentsGoAheadAndFailedOnesAreRedone) {
  constexpr uint32_t kRanks = 2;
  constexpr size_t kElements = wire::kChunkElems * 20 + 5;
  const std::vector<double> step_magnitude = {1, 1, 4096, 1.0 / 4096, 1};
  LoopbackAggregator aggregator(kRanks, {.drop_every_nth_result = 7});
  auto input = [&](uint32_t rank, size_t step, size_t i) {
    return static_cast<float>(std::sin(0.001 * i) * (rank + 1) * step_magnitude[step]);
  };
  // 21 value chunks and their exponent chunk, more than the window: without
  // rank 1, rank 0 sends the least congestion window of step 1 (iteration tag
  // 1) only if its values need not wait for the exponents.
  const auto window = static_cast<uint32_t>(worker::CongestionWindow::kMinimum);
  uint64_t ahead_after_step_0 = 0;
  run_ranks(aggregator, kRanks, kElements, [&](Communicator& communicator, uint32_t rank) {
    for (size_t step = 0; step < step_magnitude.size(); ++step) {
      if (step == 1 && rank == 0) ahead_after_step_0 = aggregator.values_ahead_of_exponents();
      if (step == 1 && rank == 1) {
        EXPECT_TRUE(aggregator.wait_for_chunks(1, window)) << "rank 0's values waited for the exponents";
      }
      communicator.begin_step();
      std::vector<float> values(kElements);
      for (size_t i = 0; i < kElements; ++i) values[i] = input(rank, step, i);
      communicator.allreduce(values.data(), values.size());
      // |sum| < 3 * magnitude <= 2^(2 + log2 magnitude); plus half a float ulp.
      const int exponent = 2 + static_cast<int>(std::log2(step_magnitude[step]));
      const double tolerance = quant::error_bound(exponent + quant::kMaxExponentExcess, kRanks) +
                               std::ldexp(1.0, exponent - 24);
      for (size_t i = 0; i < kElements; ++i)
        ASSERT_NEAR(values[i], double{input(0, step, i)} + input(1, step, i), tolerance)
            << "step " << step << " element " << i;
    }
  });
  EXPECT_EQ(ahead_after_step_0, 0u) << "step 0 has nothing to predict from";
  EXPECT_GT(aggregator.values_ahead_of_exponents(), 0u);
  EXPECT_GT(aggregator.results_dropped(), 0u);
}

TEST(Communicator, AggregatorErrorFailsPendingAndLaterOperations) {
  LoopbackAggregator aggregator(1, {.drop_data = true});
  Communicator communicator(aggregator.config(0, wire::kChunkElems));
  std::vector<int32_t> values(wire::kChunkElems, 1);
  auto pending = communicator.allreduce_async(values.data(), values.size());
  std::this_thread::sleep_for(50ms);
  aggregator.report_error("job 7: rank 2 disconnected");
  for (auto& work : {pending, communicator.allreduce_async(values.data(), values.size())}) {
    try {
      work->wait();
      ADD_FAILURE() << "completed";
    } catch (const CommError& error) {
      EXPECT_STREQ(error.what(), "job 7: rank 2 disconnected");
    }
  }
}

TEST(Communicator, OperationTimeoutNamesTheMissingChunks) {
  LoopbackAggregator aggregator(1, {.drop_data = true});
  CommunicatorConfig config = aggregator.config(0, wire::kChunkElems * 20);
  config.operation_timeout = 200ms;
  Communicator communicator(config);
  std::vector<int32_t> values(wire::kChunkElems * 20, 1);
  try {
    communicator.allreduce(values.data(), values.size());
    ADD_FAILURE() << "completed";
  } catch (const TimeoutError& error) {
    EXPECT_STREQ(error.what(),
                 "job 7 rank 0 operation 0: timed out with 20 of 20 chunks missing "
                 "(first: 0, 1, 2, 3, 4, 5, 6, 7); ranks that did not contribute: unknown (no answer from the "
                 "aggregator)");  // this aggregator reads nothing after the join
  }
  EXPECT_THROW(communicator.allreduce(values.data(), wire::kChunkElems * 20 + 1), ConfigError);
  // The ranks may no longer agree on the job's chunks: later operations fail.
  try {
    communicator.allreduce(values.data(), values.size());
    ADD_FAILURE() << "an operation after a timeout completed";
  } catch (const TimeoutError& error) {
    ADD_FAILURE() << "timed out again instead of failing at once: " << error.what();
  } catch (const CommError& error) {
    EXPECT_NE(std::string(error.what()).find("the job is unusable since operation 0 failed: job 7 rank 0 operation 0: "
                                             "timed out"),
              std::string::npos)
        << error.what();
  }
}

// A job spread over two aggregators with weights 2:1, each giving every rank
// its own result port (so a rank listens on two sockets): every element comes
// back right, despite lost results, and each aggregator held its share.
TEST(ShardedCommunicator, SpreadsChunksByWeightAndReassemblesResults) {
  constexpr uint32_t kRanks = 3;
  constexpr size_t kElements = wire::kChunkElems * 30 + 77;
  LoopbackAggregator heavy(kRanks, {.drop_every_nth_result = 11});
  LoopbackAggregator light(kRanks);
  auto input = [](uint32_t rank, size_t i) { return static_cast<int32_t>(i % 1000) * 3 + static_cast<int32_t>(rank); };
  std::vector<std::jthread> threads;
  std::vector<std::string> failures(kRanks);
  for (uint32_t rank = 0; rank < kRanks; ++rank)
    threads.emplace_back([&, rank] {
      try {
        CommunicatorConfig config = heavy.config(rank, kElements);
        config.aggregators = {heavy.endpoint(), light.endpoint()};
        config.aggregator_weights = {2, 1};
        Communicator communicator(config);
        for (int round = 0; round < 3; ++round) {
          std::vector<int32_t> values(kElements);
          for (size_t i = 0; i < kElements; ++i) values[i] = input(rank, i) + round;
          std::vector<float> floats(kElements);
          for (size_t i = 0; i < kElements; ++i) floats[i] = static_cast<float>(values[i]) / 8;
          auto float_work = communicator.allreduce_async(floats.data(), floats.size(), ReduceOp::Sum);
          communicator.allreduce(values.data(), values.size(), ReduceOp::Sum);
          float_work->wait();
          for (size_t i = 0; i < kElements; ++i) {
            int32_t expected = input(0, i) + input(1, i) + input(2, i) + 3 * round;
            ASSERT_EQ(values[i], expected) << "element " << i;
            ASSERT_NEAR(floats[i], expected / 8.0, 1e-3) << "element " << i;
          }
        }
      } catch (const std::exception& error) {
        failures[rank] = error.what();
      }
    });
  threads.clear();
  for (uint32_t rank = 0; rank < kRanks; ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
  // Two thirds and one third of the job's chunks, as the weights say.
  const uint32_t total = heavy.job_chunks() + light.job_chunks();
  EXPECT_EQ(heavy.job_chunks(), total - total / 3);
  EXPECT_EQ(light.job_chunks(), total / 3);
  EXPECT_GT(light.chunks_with_data(), 0u);
  EXPECT_NEAR(double(heavy.chunks_with_data()) / double(light.chunks_with_data()), 2.0, 0.2);
}

TEST(ShardedCommunicator, RefusesAggregatorListedTwiceOrMismatchedWeights) {
  CommunicatorConfig config = valid_config(9);
  config.aggregators = {"127.0.0.1:9", "127.0.0.1:9"};
  EXPECT_THROW(
      try { Communicator communicator(config); } catch (const ConfigError& error) {
        EXPECT_NE(std::string(error.what()).find("listed twice"), std::string::npos) << error.what();
        throw;
      },
      ConfigError);
  config.aggregators = {"127.0.0.1:9", "127.0.0.1:10"};
  config.aggregator_weights = {1};
  EXPECT_THROW(
      try { Communicator communicator(config); } catch (const ConfigError& error) {
        EXPECT_NE(std::string(error.what()).find("1 aggregator_weights for 2 aggregators"), std::string::npos)
            << error.what();
        throw;
      },
      ConfigError);
  config.aggregator_weights = {};
  config.aggregators = {"127.0.0.1:99999"};
  EXPECT_THROW(Communicator communicator(config), ConfigError);
}

}  // namespace
}  // namespace xagg
