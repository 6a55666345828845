// The testbed itself: idempotent up, complete down, broadcast delivery; the
// aggregator layouts (dedicated K, co-located) with their links' shaping and
// loss, and a cluster with a server on every aggregator host.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>

#include "counters.h"
#include "e2e_support.h"
#include "impairment.h"
#include "shaping.h"
#include "testbed.h"

namespace xagg::testbed {
namespace {

constexpr const char* kPrefix = "xagg-e2etb";
// A namespace whose name the prefix's must not match; down() leaves it alone.
const std::string kNeighbour = std::string(kPrefix) + "x-sw";

// Ignores errors: the namespace is mostly not there.
void delete_neighbour() {
  try {
    run_command({"ip", "netns", "delete", kNeighbour});
  } catch (const CommandError&) {
  }
}

class TestbedTest : public ::testing::Test {
 protected:
  void SetUp() override { e2e::require_root(); }
  void TearDown() override {
    delete_neighbour();
    bed_.down();
  }

  // The identity of a worker's veth (ifindex and MAC) changes if it is recreated.
  std::string link_identity(uint32_t worker) {
    return run_command({"ip", "-n", bed_.worker(worker).netns, "-o", "link", "show", "dev", kHostInterface});
  }

  Testbed bed_{kPrefix};
};

TEST_F(TestbedTest, UpTwiceKeepsTheExistingTestbed) {
  bed_.up(2);
  auto namespaces = bed_.existing_namespaces();
  auto identity = link_identity(1);
  EXPECT_EQ(namespaces.size(), 4u);

  bed_.up(2);
  EXPECT_EQ(bed_.existing_namespaces(), namespaces);
  EXPECT_EQ(link_identity(1), identity);
}

TEST_F(TestbedTest, UpWithAnotherWorkerCountRebuilds) {
  bed_.up(3);
  bed_.up(2);
  EXPECT_EQ(bed_.existing_workers(), 2u);
  EXPECT_EQ(bed_.existing_namespaces().size(), 4u);
}

// `xagg testbed up` never rebuilds a testbed of another shape under its prefix
// (someone's run would lose its namespaces): it refuses, naming the way out.
TEST_F(TestbedTest, CommandRefusesAPrefixTakenByAnotherShape) {
  run_command({XAGG_BINARY, "testbed", "up", "--workers", "2", "--prefix", kPrefix});
  auto identity = link_identity(1);
  run_command({XAGG_BINARY, "testbed", "up", "--workers", "2", "--prefix", kPrefix});  // the same: kept
  try {
    run_command({XAGG_BINARY, "testbed", "up", "--workers", "3", "--prefix", kPrefix});
    ADD_FAILURE() << "a testbed of another shape was rebuilt";
  } catch (const CommandError& error) {
    EXPECT_NE(std::string(error.what()).find(fmt::format("testbed {} is taken: it exists with 2 workers", kPrefix)),
              std::string::npos)
        << error.what();
  }
  EXPECT_EQ(bed_.existing_workers(), 2u);
  EXPECT_EQ(link_identity(1), identity);
}

TEST_F(TestbedTest, DownRemovesEveryNamespaceOfThePrefixOnly) {
  bed_.up(2);
  // Leftovers of crashed runs with more workers or aggregators in every layout,
  // and a neighbour with a longer prefix.
  std::vector<std::string> leftovers;
  for (const char* role : {"-w7", "-agg5", "-h3", "-a3"}) leftovers.push_back(std::string(kPrefix) + role);
  for (const auto& leftover : leftovers) run_command({"ip", "netns", "add", leftover});
  delete_neighbour();  // a crashed run may have left it
  run_command({"ip", "netns", "add", kNeighbour});

  bed_.down();
  EXPECT_TRUE(bed_.existing_namespaces().empty());
  for (const auto& leftover : leftovers) EXPECT_FALSE(std::filesystem::exists("/run/netns/" + leftover));
  EXPECT_TRUE(std::filesystem::exists("/run/netns/" + kNeighbour));
}

int udp_socket_in(const std::string& netns) { return socket_in(netns, SOCK_DGRAM); }

TEST_F(TestbedTest, DirectedBroadcastFromTheAggregatorReachesEveryWorker) {
  constexpr uint32_t kWorkers = 3;
  constexpr uint16_t kPort = 9999;
  bed_.up(kWorkers);

  std::vector<int> receivers;
  for (uint32_t i = 0; i < kWorkers; ++i) {
    int fd = udp_socket_in(bed_.worker(i).netns);
    receivers.push_back(fd);
    sockaddr_in any{.sin_family = AF_INET, .sin_port = htons(kPort), .sin_addr = {htonl(INADDR_ANY)}, .sin_zero = {}};
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof any), 0) << strerror(errno);
    timeval timeout{.tv_sec = 3, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  }

  int sender = udp_socket_in(bed_.aggregator().netns);
  int on = 1;
  ASSERT_EQ(setsockopt(sender, SOL_SOCKET, SO_BROADCAST, &on, sizeof on), 0);
  sockaddr_in broadcast{.sin_family = AF_INET, .sin_port = htons(kPort), .sin_addr = {}, .sin_zero = {}};
  inet_pton(AF_INET, kBroadcastAddress, &broadcast.sin_addr);
  const std::string message = "xagg broadcast probe";
  ASSERT_EQ(sendto(sender, message.data(), message.size(), 0, reinterpret_cast<sockaddr*>(&broadcast), sizeof broadcast),
            static_cast<ssize_t>(message.size()))
      << strerror(errno);
  close(sender);

  for (uint32_t i = 0; i < kWorkers; ++i) {
    char buffer[64] = {};
    ssize_t n = recv(receivers[i], buffer, sizeof buffer, 0);
    EXPECT_EQ(std::string(buffer, n > 0 ? n : 0), message) << "worker " << i << " got no broadcast";
    close(receivers[i]);
  }
}

sockaddr_in socket_address(const std::string& address, uint16_t port) {
  sockaddr_in target{.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = {}, .sin_zero = {}};
  inet_pton(AF_INET, address.c_str(), &target.sin_addr);
  return target;
}

void set_timeout(int fd, std::chrono::milliseconds timeout) {
  timeval value{.tv_sec = timeout.count() / 1000, .tv_usec = timeout.count() % 1000 * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &value, sizeof value);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &value, sizeof value);
}

// A TCP socket listening on host.address:port inside the host's namespace.
int tcp_listener(const HostLink& host, uint16_t port) {
  int fd = socket_in(host.netns, SOCK_STREAM);
  int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in local = socket_address(host.address, port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 || listen(fd, 64) != 0)
    throw std::system_error(errno, std::generic_category(), "bind/listen on " + host.address);
  return fd;
}

constexpr uint16_t kProbePort = 9998;

// TCP, so that a missing route, neighbour or bridge port shows as a failed connect.
void expect_every_worker_reaches_every_aggregator(const Testbed& bed, uint32_t workers) {
  for (uint32_t k = 0; k < bed.aggregator_count(); ++k) {
    HostLink aggregator = bed.aggregator(k);
    int listener = tcp_listener(aggregator, kProbePort);
    for (uint32_t i = 0; i < workers; ++i)
      EXPECT_TRUE(tcp_port_open(bed.worker(i).netns, aggregator.address, kProbePort))
          << "worker " << i << " cannot reach aggregator " << k << " at " << aggregator.address;
    close(listener);
  }
}

// Seconds from the first byte sent to the last received of `bytes` over TCP from `from` to `to`.
double transfer_seconds(const HostLink& from, const HostLink& to, size_t bytes) {
  int listener = tcp_listener(to, kProbePort);
  set_timeout(listener, std::chrono::seconds(10));
  int sender = socket_in(from.netns, SOCK_STREAM);
  set_timeout(sender, std::chrono::seconds(10));
  sockaddr_in target = socket_address(to.address, kProbePort);
  if (connect(sender, reinterpret_cast<sockaddr*>(&target), sizeof target) != 0)
    throw std::system_error(errno, std::generic_category(), "connect to " + to.address);
  size_t received = 0;
  Clock::time_point last_byte;
  std::thread receiver([&] {
    int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    set_timeout(fd, std::chrono::seconds(10));
    std::vector<char> buffer(1 << 16);
    for (ssize_t n; (n = recv(fd, buffer.data(), buffer.size(), 0)) > 0;) received += static_cast<size_t>(n);
    last_byte = Clock::now();
    close(fd);
  });
  std::vector<char> data(bytes, 'x');
  const Clock::time_point start = Clock::now();
  for (size_t sent = 0; sent < bytes;) {
    ssize_t n = send(sender, data.data() + sent, bytes - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  shutdown(sender, SHUT_WR);
  receiver.join();
  close(sender);
  close(listener);
  EXPECT_EQ(received, bytes) << from.netns << " -> " << to.address;
  return std::chrono::duration<double>(last_byte - start).count();
}

// Whether one datagram from `from` reaches to.address within the timeout.
bool udp_delivered(const HostLink& from, const HostLink& to, std::chrono::milliseconds timeout) {
  constexpr uint16_t kPort = 9997;
  int receiver = udp_socket_in(to.netns);
  sockaddr_in local = socket_address(to.address, kPort);
  if (bind(receiver, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0)
    throw std::system_error(errno, std::generic_category(), "bind on " + to.address);
  set_timeout(receiver, timeout);
  int sender = udp_socket_in(from.netns);
  const std::string message = "xagg link probe";
  sendto(sender, message.data(), message.size(), 0, reinterpret_cast<const sockaddr*>(&local), sizeof local);
  char buffer[64] = {};
  ssize_t n = recv(receiver, buffer, sizeof buffer, 0);
  close(sender);
  close(receiver);
  return n > 0 && std::string(buffer, static_cast<size_t>(n)) == message;
}

// 2 MB over a link shaped to 0.1 Gbit/s take at least 0.16 s, less what tbf's bucket lets through at once.
constexpr size_t kShapedBytes = 2'000'000;
constexpr double kShapedGbit = 0.1;
double min_shaped_seconds() { return 0.9 * double(kShapedBytes - burst_bytes(kShapedGbit)) * 8 / (kShapedGbit * 1e9); }

std::string tc_show(const std::string& netns, const std::vector<std::string>& what) {
  std::vector<std::string> argv{"ip", "netns", "exec", netns, "tc"};
  argv.insert(argv.end(), what.begin(), what.end());
  return run_command(argv);
}

bool has_xdp(const std::string& netns, const std::string& device) {
  return run_command({"ip", "-n", netns, "link", "show", "dev", device}).find("xdp") != std::string::npos;
}

TEST(Layout, ParsesCountsAndColocated) {
  EXPECT_EQ(Layout::parse("1"), Layout{});
  EXPECT_EQ(Layout::parse("64"), (Layout{.aggregators = 64, .colocated = false}));
  EXPECT_TRUE(Layout::parse("colocated").colocated);
  EXPECT_EQ(Layout::parse("4").to_string(), "4");
  EXPECT_EQ(Layout::parse("colocated").to_string(), "colocated");
  for (const char* bad : {"", "0", "65", "-1", "+2", " 2", "2x", "3.0", "99999999999", "colocate"}) {
    try {
      Layout::parse(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find("aggregators"), std::string::npos) << error.what();
    }
  }
}

TEST_F(TestbedTest, DedicatedAggregatorsEachGetALinkOfTheirOwn) {
  constexpr uint32_t kWorkers = 3;
  const Layout layout{.aggregators = 3, .colocated = false};
  bed_.up(kWorkers, layout);
  const std::string p = kPrefix;
  const std::vector<std::string> expected{p + "-agg", p + "-agg1", p + "-agg2", p + "-sw",
                                          p + "-w0",  p + "-w1",   p + "-w2"};
  EXPECT_EQ(bed_.existing_namespaces(), expected);
  EXPECT_EQ(bed_.layout(), layout);
  EXPECT_EQ(Testbed(kPrefix).layout(), layout) << "detected from the namespaces";
  EXPECT_EQ(bed_.aggregator_addresses(), (std::vector<std::string>{"198.18.0.1", "198.18.0.2", "198.18.0.3"}));
  EXPECT_EQ(bed_.aggregator(2).bridge_port, "agg2");
  EXPECT_THROW(bed_.aggregator(3), std::out_of_range);
  for (uint32_t k = 0; k < 3; ++k) EXPECT_TRUE(has_xdp(bed_.switch_netns(), bed_.aggregator(k).bridge_port)) << k;
  expect_every_worker_reaches_every_aggregator(bed_, kWorkers);

  // Aggregator 1's link alone is shaped, both directions (the ingress through its ifb).
  {
    Shaping shaping(bed_, {.aggregator_gbit = {0, kShapedGbit, 0}, .worker_gbit = {}});
    EXPECT_EQ(tc_show(bed_.switch_netns(), {"qdisc", "show", "dev", "agg"}).find("tbf"), std::string::npos);
    EXPECT_GE(transfer_seconds(bed_.worker(0), bed_.aggregator(1), kShapedBytes), min_shaped_seconds());
    EXPECT_GE(transfer_seconds(bed_.aggregator(1), bed_.worker(0), kShapedBytes), min_shaped_seconds());
    EXPECT_THROW(Shaping(bed_, {.aggregator_gbit = {0, 0, 0, 1}, .worker_gbit = {}}), std::invalid_argument);
  }
  // Loss filters on both directions of every aggregator's link.
  Impairment loss(bed_, kWorkers, 0.0);
  for (uint32_t k = 0; k < 3; ++k)
    for (const char* end : {"ingress", "egress"})
      EXPECT_NE(tc_show(bed_.switch_netns(), {"filter", "show", "dev", bed_.aggregator(k).bridge_port, end}).find("bpf"),
                std::string::npos)
          << "aggregator " << k << " " << end;

  bed_.down();
  EXPECT_TRUE(bed_.existing_namespaces().empty());
}

TEST_F(TestbedTest, ColocatedHostsSwitchInternallyAndEveryWorkerReachesEveryAggregator) {
  constexpr uint32_t kWorkers = 3;
  bed_.up(kWorkers, Layout::parse("colocated"));
  std::set<std::string> expected{bed_.switch_netns()};
  for (uint32_t i = 0; i < kWorkers; ++i)
    for (const char* role : {"-h", "-w", "-a"}) expected.insert(std::string(kPrefix) + role + std::to_string(i));
  auto namespaces = bed_.existing_namespaces();
  EXPECT_EQ(std::set<std::string>(namespaces.begin(), namespaces.end()), expected);
  EXPECT_TRUE(Testbed(kPrefix).layout().colocated) << "detected from the namespaces";
  EXPECT_EQ(bed_.aggregator_count(), kWorkers);
  EXPECT_EQ(bed_.aggregator_addresses(), (std::vector<std::string>{"198.18.2.1", "198.18.2.2", "198.18.2.3"}));
  for (uint32_t i = 0; i < kWorkers; ++i) {
    EXPECT_TRUE(has_xdp(bed_.aggregator(i).bridge_netns, bed_.aggregator(i).bridge_port)) << i;
    EXPECT_FALSE(has_xdp(bed_.worker(i).bridge_netns, bed_.worker(i).bridge_port)) << i;
  }
  expect_every_worker_reaches_every_aggregator(bed_, kWorkers);

  // Another layout rebuilds; so does going back.
  bed_.up(kWorkers);
  EXPECT_EQ(bed_.existing_namespaces().size(), kWorkers + 2);
  EXPECT_FALSE(Testbed(kPrefix).layout().colocated);
  bed_.down();
  EXPECT_TRUE(bed_.existing_namespaces().empty());
}

// Host 0's link shaped: whether its worker or its aggregator sends or
// receives, the traffic pays the link's rate, while the host's worker reaches
// its own aggregator without crossing the link.
TEST_F(TestbedTest, ColocatedHostLinkCarriesItsWorkerAndItsAggregatorAlike) {
  constexpr uint32_t kWorkers = 3;
  const double shaped_s = min_shaped_seconds();
  bed_.up(kWorkers, Layout::parse("colocated"));
  EXPECT_THROW(Shaping(bed_, {.aggregator_gbit = {1}, .worker_gbit = {}}), std::invalid_argument);
  Shaping shaping(bed_, {.aggregator_gbit = {}, .worker_gbit = {kShapedGbit, 0, 0}});

  EXPECT_GE(transfer_seconds(bed_.worker(0), bed_.aggregator(1), kShapedBytes), shaped_s) << "worker 0 out";
  EXPECT_GE(transfer_seconds(bed_.aggregator(0), bed_.worker(1), kShapedBytes), shaped_s) << "aggregator 0 out";
  EXPECT_GE(transfer_seconds(bed_.worker(1), bed_.aggregator(0), kShapedBytes), shaped_s) << "aggregator 0 in";
  EXPECT_GE(transfer_seconds(bed_.aggregator(1), bed_.worker(0), kShapedBytes), shaped_s) << "worker 0 in";
  EXPECT_LT(transfer_seconds(bed_.worker(0), bed_.aggregator(0), kShapedBytes), shaped_s) << "inside host 0";
}

TEST_F(TestbedTest, ColocatedLossCutsHostLinksButNotTrafficInsideAHost) {
  constexpr uint32_t kWorkers = 2;
  constexpr std::chrono::milliseconds kWait{500};
  bed_.up(kWorkers, Layout::parse("colocated"));
  ASSERT_TRUE(udp_delivered(bed_.worker(0), bed_.aggregator(1), std::chrono::seconds(3)));  // neighbours resolved

  Impairment loss(bed_, kWorkers, 1.0);
  EXPECT_FALSE(udp_delivered(bed_.worker(0), bed_.aggregator(1), kWait));
  EXPECT_FALSE(udp_delivered(bed_.aggregator(1), bed_.worker(0), kWait));
  EXPECT_GT(loss.counters().dropped, 0u);
  EXPECT_TRUE(udp_delivered(bed_.worker(0), bed_.aggregator(0), kWait));
  EXPECT_TRUE(udp_delivered(bed_.aggregator(1), bed_.worker(1), kWait));
  loss.set_rate(0.0);
  EXPECT_TRUE(udp_delivered(bed_.worker(0), bed_.aggregator(1), std::chrono::seconds(3)));
}

// bpffs outlives a namespace: what an aggregator killed there left pinned goes with it.
TEST_F(TestbedTest, DownRemovesThePinsOfAKilledAggregator) {
  bed_.up(1);
  Cluster cluster(XAGG_BINARY, bed_);
  cluster.start_aggregator(Clock::now() + std::chrono::seconds(30));
  std::string pins;
  run_in_netns(bed_.aggregator(0).netns, [&] { pins = dataplane::pin_dir(kHostInterface); });
  ASSERT_TRUE(std::filesystem::exists(pins)) << pins;
  ASSERT_EQ(kill(cluster.aggregator_pid(), SIGKILL), 0);
  cluster.stop_aggregator();
  EXPECT_TRUE(std::filesystem::exists(pins)) << "a killed aggregator cannot have removed its pins";
  bed_.down();
  EXPECT_FALSE(std::filesystem::exists(pins)) << pins;
}

TEST_F(TestbedTest, ClusterRunsAServerOnEveryAggregatorHost) {
  constexpr uint32_t kWorkers = 2;
  bed_.up(kWorkers, {.aggregators = 3, .colocated = false});
  Cluster cluster(XAGG_BINARY, bed_);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (AggregatorKind kind : {AggregatorKind::Xdp, AggregatorKind::TcpPs}) {
    cluster.start_aggregator(deadline, kind);
    EXPECT_EQ(cluster.aggregator_pids().size(), 3u);
    EXPECT_EQ(cluster.aggregator_pid(), cluster.aggregator_pids().front());
    EXPECT_TRUE(cluster.aggregator_running());
    ProcessResult stopped = cluster.stop_aggregator();
    EXPECT_EQ(stopped.exit_code, 0) << stopped.output;
    EXPECT_NE(stopped.output.find("--- aggregator 2 ---"), std::string::npos) << stopped.output;
    EXPECT_FALSE(cluster.aggregator_running());
    EXPECT_TRUE(cluster.aggregator_pids().empty());
  }
  // The switch baseline models one switch: aggregator 0 only.
  cluster.start_aggregator(deadline, AggregatorKind::Switch);
  EXPECT_EQ(cluster.aggregator_pids().size(), 1u);
  EXPECT_EQ(cluster.stop_aggregator().exit_code, 0);
}

// Every worker gets every aggregator's address and the job's shares spread over them.
TEST_F(TestbedTest, ClusterRunsAJobOnEveryLayout) {
  constexpr uint32_t kWorkers = 3;
  for (const char* layout : {"3", "colocated"}) {
    SCOPED_TRACE(layout);
    bed_.up(kWorkers, Layout::parse(layout));
    Cluster cluster(XAGG_BINARY, bed_);
    cluster.start_aggregator(Clock::now() + std::chrono::seconds(30));
    JobSpec job;
    job.workers = kWorkers;
    job.elements = 100'000;
    job.iterations = 2;
    for (const ProcessResult& result : cluster.run_workers(job, Clock::now() + std::chrono::seconds(60))) {
      EXPECT_EQ(result.exit_code, 0) << result.output;
      auto reports = worker_reports(result.output);
      EXPECT_EQ(reports.size(), job.iterations) << result.output;
      for (const auto& report : reports) EXPECT_EQ(report.at("wrong").get<uint64_t>(), 0u) << report.dump();
    }
    ProcessResult aggregators = cluster.stop_aggregator();
    size_t joined = 0;  // each aggregator logs its share of the job once all ranks joined it
    for (size_t at = 0; (at = aggregators.output.find("all 3 ranks joined", at)) != std::string::npos; ++at) ++joined;
    EXPECT_EQ(joined, bed_.aggregator_count());
    if (HasFailure()) std::cerr << "aggregators:\n" << aggregators.output << "\n";
  }
}

}  // namespace
}  // namespace xagg::testbed
