// Congestion control with real packets in namespaces: the testbed's support
// (the competing bulk TCP flow, testbed::CompetingFlow, and the phantom-queue
// ECN marker, bpf/xagg_ecn.bpf.c, both applied through a scenario,
// testbed::ScenarioNetwork, and their cleanup, also on failure), then the
// worker library's window against an overflowing bottleneck (ECN and delay).
#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <iostream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "cluster.h"
#include "e2e_support.h"
#include "scenario.h"
#include "testbed.h"
#include "unique_fd.h"
#include "wire.h"

namespace xagg::testbed {
namespace {

using namespace std::chrono_literals;

constexpr uint8_t kNotEct = 0, kEct1 = 1, kEct0 = 2, kCe = 3;
constexpr double kLinkGbit = 0.1;
constexpr double kThresholdKb = 64;
constexpr size_t kDatagramBytes = 1200;
constexpr uint16_t kPort = 9995;

class TestbedCongestion : public ::testing::Test {
 protected:
  void SetUp() override {
    e2e::require_root();
    bed_.up(2);
  }
  void TearDown() override {
    bed_.down();
    EXPECT_TRUE(bed_.existing_namespaces().empty()) << "namespaces left behind";
  }

  Scenario scenario() const {
    Scenario s;
    s.workers = 2;
    s.compute_ms = {0, 0};
    return s;
  }

  // Everything the scenario network may have installed on a link end.
  std::string tc_state(const std::string& netns, const std::string& device) {
    return run_command({"ip", "netns", "exec", netns, "tc", "qdisc", "show", "dev", device}) +
           run_command({"ip", "netns", "exec", netns, "tc", "filter", "show", "dev", device, "egress"});
  }
  void expect_link_bare(const HostLink& link) {
    for (const auto& [netns, device] : {std::pair{link.netns, link.interface}, {link.bridge_netns, link.bridge_port}}) {
      const std::string state = tc_state(netns, device);
      EXPECT_EQ(state.find("tbf"), std::string::npos) << netns << " " << device << ":\n" << state;
      EXPECT_EQ(state.find("clsact"), std::string::npos) << netns << " " << device << ":\n" << state;
      EXPECT_EQ(state.find("bpf"), std::string::npos) << netns << " " << device << ":\n" << state;
    }
    EXPECT_FALSE(try_command({"ip", "-n", link.bridge_netns, "link", "show", "dev", ingress_device(link.bridge_port)}))
        << "ifb left behind";
  }
  // TCP connections of a namespace (ss prints one line of headings).
  size_t tcp_sockets(const std::string& netns) {
    const std::string out = run_command({"ip", "netns", "exec", netns, "ss", "-Htan"});
    return static_cast<size_t>(std::count(out.begin(), out.end(), '\n'));
  }

  Testbed bed_{per_run_prefix("xcc")};
};

// ---- the competing flow ----

TEST_F(TestbedCongestion, CompetingFlowMovesDataAtTheLinkRateAndStopsCleanly) {
  Scenario s = scenario();
  s.worker_gbit = {0.2, 0};
  s.competing_flows = {{{HostRef::Role::Worker, 0}, {HostRef::Role::Aggregator, 0}}};
  {
    ScenarioNetwork network(bed_, s);
    ASSERT_EQ(network.flows().size(), 1u);
    CompetingFlow& flow = *network.flows().front();
    EXPECT_EQ(flow.label(), "worker 0 -> aggregator 0");
    const Clock::time_point started = Clock::now();
    std::this_thread::sleep_for(3s);
    EXPECT_GT(flow.bytes_received(), 0u);
    const FlowReport report = flow.stop();
    EXPECT_EQ(report.error, "");
    EXPECT_NEAR(report.seconds, 3, 0.5);
    // A bulk TCP flow fills its shaped link: tbf's bucket and TCP's start cost a little.
    EXPECT_GT(report.gbit(), 0.8 * 0.2) << report.bytes << " bytes in " << report.seconds << " s";
    EXPECT_LT(report.gbit(), 1.05 * 0.2) << report.bytes << " bytes in " << report.seconds << " s";
    // The goodput over a window inside the run, as the benchmarks take it for their timed iterations.
    const double window_gbit = flow.gbit_between(started + 1s, started + 2500ms);
    EXPECT_GT(window_gbit, 0.8 * 0.2);
    EXPECT_LT(window_gbit, 1.05 * 0.2);
    EXPECT_EQ(flow.bytes_at(started + 1h), report.bytes);  // after the stop: all it moved
    std::cout << "competing flow: " << report.bytes << " bytes in " << report.seconds << " s, " << report.gbit()
              << " Gbit/s on a 0.2 Gbit/s link\n";
    // Stopped: no more bytes, no sockets left on either side, the same report again.
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(flow.bytes_received(), report.bytes);
    EXPECT_EQ(flow.stop().bytes, report.bytes);
    EXPECT_EQ(tcp_sockets(bed_.worker(0).netns), 0u);
    EXPECT_EQ(tcp_sockets(bed_.aggregator().netns), 0u);
  }
  expect_link_bare(bed_.worker(0));
}

TEST_F(TestbedCongestion, CompetingFlowThatCannotConnectFailsAndLeavesNothingBehind) {
  Scenario s = scenario();
  s.worker_gbit = {0.2, 0.2};
  s.ecn_marking = {{{HostRef::Role::Worker, 0}, kThresholdKb, 1.0}};
  s.competing_flows = {{{HostRef::Role::Worker, 0}, {HostRef::Role::Worker, 1}}};
  // Worker 1 unreachable: the flow's connect fails after the shaping and the marker are in place.
  run_command({"ip", "-n", bed_.worker(1).netns, "link", "set", "dev", kHostInterface, "down"});
  try {
    ScenarioNetwork network(bed_, s);
    ADD_FAILURE() << "a flow to a host that is down started";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("competing flow worker 0 -> worker 1"), std::string::npos)
        << error.what();
  }
  expect_link_bare(bed_.worker(0));
  expect_link_bare(bed_.worker(1));
  EXPECT_EQ(tcp_sockets(bed_.worker(0).netns), 0u);
}

// `xagg testbed flow` on a testbed that is up: the goodput, or a refusal naming the host.
TEST_F(TestbedCongestion, CommandRunsAFlowAndRefusesAHostTheTestbedLacks) {
  const std::string output = run_command({XAGG_BINARY, "testbed", "flow", "--from", "worker 1", "--to", "aggregator 0",
                                          "--seconds", "0.5", "--prefix", bed_.prefix()});
  EXPECT_NE(output.find("worker 1 -> aggregator 0: "), std::string::npos) << output;
  EXPECT_NE(output.find(" Gbit/s"), std::string::npos) << output;
  try {
    run_command({XAGG_BINARY, "testbed", "flow", "--from", "worker 2", "--to", "aggregator 0", "--prefix",
                 bed_.prefix()});
    ADD_FAILURE() << "a flow from a worker the testbed lacks ran";
  } catch (const CommandError& error) {
    EXPECT_NE(std::string(error.what()).find("worker 2: the testbed has 2 workers"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(tcp_sockets(bed_.worker(1).netns), 0u);
}

// ---- the ECN marker ----

struct TosCounts {
  size_t datagrams = 0;
  size_t by_ecn[4] = {};  // indexed by the ECN field received
};

// Receives datagrams on to.address:kPort, reading each one's TOS byte
// (IP_RECVTOS), until nothing arrives for 300 ms after `done` is set.
class TosReceiver {
 public:
  explicit TosReceiver(const HostLink& to) : fd_(socket_in(to.netns, SOCK_DGRAM)) {
    int on = 1, buffer = 8 << 20;
    setsockopt(fd_.get(), IPPROTO_IP, IP_RECVTOS, &on, sizeof on);
    setsockopt(fd_.get(), SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer);
    sockaddr_in local{.sin_family = AF_INET, .sin_port = htons(kPort), .sin_addr = {}, .sin_zero = {}};
    inet_pton(AF_INET, to.address.c_str(), &local.sin_addr);
    if (bind(fd_.get(), reinterpret_cast<sockaddr*>(&local), sizeof local) != 0)
      throw std::system_error(errno, std::generic_category(), "bind " + to.address);
    timeval timeout{.tv_sec = 0, .tv_usec = 300'000};
    setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    thread_ = std::thread([this] { run(); });
  }
  TosCounts finish() {
    done_ = true;
    thread_.join();
    return counts_;
  }

 private:
  void run() {
    std::vector<char> payload(65536);
    while (true) {
      char control[CMSG_SPACE(sizeof(int))] = {};
      iovec io{.iov_base = payload.data(), .iov_len = payload.size()};
      msghdr message{};
      message.msg_iov = &io;
      message.msg_iovlen = 1;
      message.msg_control = control;
      message.msg_controllen = sizeof control;
      if (recvmsg(fd_.get(), &message, 0) < 0) {
        if (done_) return;
        continue;
      }
      ++counts_.datagrams;
      for (cmsghdr* c = CMSG_FIRSTHDR(&message); c; c = CMSG_NXTHDR(&message, c))
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) ++counts_.by_ecn[*CMSG_DATA(c) & 3];
    }
  }

  UniqueFd fd_;
  std::atomic<bool> done_{false};
  TosCounts counts_;
  std::thread thread_;
};

// Sends kDatagramBytes datagrams with this ECN field from `from` to `to`:
// one per `gap` (no catching up after a late wake-up), or as fast as the
// socket takes them when gap is 0; for `duration`. Returns what `to` received.
TosCounts send_udp(const HostLink& from, const HostLink& to, uint8_t ecn, std::chrono::microseconds gap,
                   std::chrono::milliseconds duration) {
  TosReceiver receiver(to);
  UniqueFd fd(socket_in(from.netns, SOCK_DGRAM));
  int tos = ecn;
  setsockopt(fd.get(), IPPROTO_IP, IP_TOS, &tos, sizeof tos);
  sockaddr_in target{.sin_family = AF_INET, .sin_port = htons(kPort), .sin_addr = {}, .sin_zero = {}};
  inet_pton(AF_INET, to.address.c_str(), &target.sin_addr);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&target), sizeof target) != 0)
    throw std::system_error(errno, std::generic_category(), "connect " + to.address);
  const std::vector<char> payload(kDatagramBytes, 'e');
  for (const auto end = Clock::now() + duration; Clock::now() < end;) {
    send(fd.get(), payload.data(), payload.size(), 0);  // ENOBUFS when tbf's queue is full: that is the point
    if (gap.count() > 0) std::this_thread::sleep_for(gap);
  }
  return receiver.finish();
}

struct MarkerCase {
  std::string name;
  HostRef link;
  HostRef from, to;  // the traffic's direction over that link
};

class TestbedEcnMarker : public TestbedCongestion, public ::testing::WithParamInterface<MarkerCase> {};

// Below the link's rate ECT traffic is left alone; above it Not-ECT traffic
// is never marked and ECT traffic is, and the receiver sees CE in the header
// (so the checksum was rewritten right: the kernel drops bad ones).
TEST_P(TestbedEcnMarker, MarksEctAboveTheLinkRateOnly) {
  const MarkerCase& param = GetParam();
  Scenario s = scenario();
  if (param.link.role == HostRef::Role::Worker)
    s.worker_gbit = {kLinkGbit, 0};
  else
    s.aggregator_gbit = {kLinkGbit};
  s.ecn_marking = {{param.link, kThresholdKb, 1.0}};
  const HostLink from = bed_.host(param.from), to = bed_.host(param.to);
  {
    ScenarioNetwork network(bed_, s);
    ASSERT_EQ(network.markings().size(), 1u);
    const LinkMarking& marking = *network.markings().front();
    auto counters = [&] {
      MarkCounters total = marking.from_host();
      total += marking.to_host();
      return total;
    };

    // About 10% of the link (1200 bytes a millisecond at most).
    const TosCounts slow = send_udp(from, to, kEct0, 1000us, 1000ms);
    EXPECT_GT(slow.datagrams, 300u);
    EXPECT_EQ(slow.by_ecn[kCe], 0u) << "marked below the link's rate";
    EXPECT_EQ(slow.by_ecn[kEct0], slow.datagrams);
    EXPECT_GE(counters().ect, slow.datagrams);
    EXPECT_EQ(counters().marked, 0u);

    const TosCounts bulk = send_udp(from, to, kNotEct, 0us, 500ms);
    EXPECT_GT(bulk.datagrams, 1000u);
    EXPECT_EQ(bulk.by_ecn[kNotEct], bulk.datagrams) << "a Not-ECT packet was changed";
    EXPECT_EQ(counters().marked, 0u);
    EXPECT_GT(counters().max_queue_bytes, kThresholdKb * 1000) << "the phantom queue never passed the threshold";

    const TosCounts marked = send_udp(from, to, kEct1, 0us, 500ms);
    EXPECT_GT(marked.datagrams, 1000u);
    EXPECT_GT(marked.by_ecn[kCe], marked.datagrams / 10) << "ECT traffic above the link's rate was hardly marked";
    EXPECT_EQ(marked.by_ecn[kCe] + marked.by_ecn[kEct1], marked.datagrams);
    // Marked ones that tbf then dropped never arrived.
    EXPECT_GE(counters().marked, marked.by_ecn[kCe]);
    std::cout << "received: below the rate " << slow.datagrams << " ECT(0), above it " << bulk.datagrams
              << " Not-ECT, " << marked.datagrams << " ECT(1) of which " << marked.by_ecn[kCe] << " CE; marker: "
              << counters().marked << " of " << counters().ect << " ECT marked, phantom queue at most "
              << counters().max_queue_bytes << " bytes\n";
  }
  for (const HostRef host : {param.from, param.to}) expect_link_bare(bed_.link_of(host));
}

INSTANTIATE_TEST_SUITE_P(
    LinkDirections, TestbedEcnMarker,
    ::testing::Values(
        MarkerCase{"WorkerLinkUp", {HostRef::Role::Worker, 0}, {HostRef::Role::Worker, 0}, {HostRef::Role::Aggregator, 0}},
        MarkerCase{"WorkerLinkDown", {HostRef::Role::Worker, 0}, {HostRef::Role::Aggregator, 0}, {HostRef::Role::Worker, 0}},
        // From the aggregator the link is shaped on an ifb behind its bridge port's ingress.
        MarkerCase{"AggregatorLinkUp", {HostRef::Role::Aggregator, 0}, {HostRef::Role::Aggregator, 0},
                   {HostRef::Role::Worker, 1}},
        MarkerCase{"AggregatorLinkDown", {HostRef::Role::Aggregator, 0}, {HostRef::Role::Worker, 1},
                   {HostRef::Role::Aggregator, 0}}),
    [](const auto& info) { return info.param.name; });

// ---- the worker library's congestion window ----

// kSenders workers, unshaped, send into one aggregator whose link (both
// directions) is the bottleneck: first kSlowGbit, then, mid-run, kFastGbit.
// The windows must keep the link busy without overflowing tbf's queue, by the
// CE echo where the link marks and by their own round trips where it does
// not, and open again when the rate rises. (The loss-only window of before
// passes the goodput and drop checks here too; only the ECN checks tell it
// apart.) Every iteration is verified element by element by the workers.
constexpr uint32_t kSenders = 3;
constexpr uint64_t kElements = 512 * 1024;  // float32: 2 MiB per rank and iteration
constexpr uint32_t kIterations = 60;
constexpr double kSlowGbit = 0.5, kFastGbit = 1.0;
constexpr auto kSlowPhase = 2500ms;

struct WindowCase {
  std::string name;
  bool ecn;
};

class CongestionWindowE2e : public ::testing::TestWithParam<WindowCase> {
 protected:
  void SetUp() override {
    e2e::require_root();
    bed_.up(kSenders);
  }
  void TearDown() override {
    ProcessResult aggregator = cluster_.stop_aggregator();
    if (HasFailure()) std::cerr << "aggregator output:\n" << aggregator.output << "\n";
    bed_.down();
  }

  Scenario bottleneck(double gbit) const {
    Scenario s;
    s.workers = kSenders;
    s.compute_ms.assign(kSenders, 0);
    s.aggregator_gbit = {gbit};
    if (GetParam().ecn) s.ecn_marking = {{{HostRef::Role::Aggregator, 0}, kThresholdKb, 1.0}};
    return s;
  }
  // Packets tbf dropped on the aggregator's link towards it, where the workers' shares converge.
  uint64_t bottleneck_drops() {
    const ShapedDevice device = shaped_devices(bed_, {HostRef::Role::Aggregator, 0}).to_host;
    const std::string out =
        run_command({"ip", "netns", "exec", device.netns, "tc", "-s", "qdisc", "show", "dev", device.device});
    std::smatch match;
    if (!std::regex_search(out, match, std::regex("tbf[\\s\\S]*?dropped (\\d+)")))
      throw std::runtime_error("no tbf drop count in:\n" + out);
    return std::stoull(match[1]);
  }

  Testbed bed_{per_run_prefix("xcw")};
  Cluster cluster_{XAGG_BINARY, bed_};
};

// Goodput into the aggregator (every rank's share crosses its link) per
// iteration, from the slowest rank's all-reduce time.
std::vector<double> goodput_gbit(const std::vector<ProcessResult>& workers) {
  std::vector<double> slowest(kIterations, 0);
  for (const ProcessResult& worker : workers)
    for (const nlohmann::json& report : worker_reports(worker.output)) {
      EXPECT_EQ(report.at("wrong").get<uint64_t>(), 0u) << report.dump();
      auto& seconds = slowest.at(report.at("iteration").get<uint32_t>());
      seconds = std::max(seconds, report.at("seconds").get<double>());
    }
  std::vector<double> gbit;
  for (double seconds : slowest) gbit.push_back(seconds > 0 ? kSenders * kElements * 4 * 8 / seconds / 1e9 : 0);
  return gbit;
}

double median(std::vector<double> values) {
  std::ranges::nth_element(values, values.begin() + values.size() / 2);
  return values[values.size() / 2];
}

TEST_P(CongestionWindowE2e, BacksOffAtAnOverflowingBottleneckAndRecoversWhenItClears) {
  cluster_.start_aggregator(Clock::now() + 30s);
  auto slow = std::make_unique<ScenarioNetwork>(bed_, bottleneck(kSlowGbit));
  JobSpec job;
  job.workers = kSenders;
  job.elements = kElements;
  job.iterations = kIterations;
  auto workers = std::async(std::launch::async, [&] { return cluster_.run_workers(job, Clock::now() + 120s); });
  std::this_thread::sleep_for(kSlowPhase);
  const uint64_t slow_drops = bottleneck_drops();
  MarkCounters slow_marks;
  if (GetParam().ecn) slow_marks = slow->markings().front()->to_host();
  slow.reset();  // the bottleneck clears: the link runs at the higher rate
  ScenarioNetwork fast(bed_, bottleneck(kFastGbit));
  const std::vector<ProcessResult> results = workers.get();
  const uint64_t fast_drops = bottleneck_drops();
  for (const ProcessResult& worker : results) ASSERT_EQ(worker.exit_code, 0) << worker.output;

  const std::vector<double> gbit = goodput_gbit(results);
  ASSERT_EQ(std::ranges::count(gbit, 0.0), 0) << "iterations without a report";
  // Iterations 3..12 end within 1.5 s at the slow rate's pace (about 120 ms each, data
  // generation and verification included), iterations from 25 on begin after the change.
  const double slow_median = median({gbit.begin() + 3, gbit.begin() + 13});
  const double fast_median = median({gbit.begin() + 25, gbit.end()});
  std::cout << fmt::format("{}: goodput into the aggregator {:.3f} Gbit/s at {} Gbit/s, {:.3f} at {}; tbf drops "
                           "{} and {}; CE marked {} of {} ECT; per iteration: {:.2f}\n",
                           GetParam().name, slow_median, kSlowGbit, fast_median, kFastGbit, slow_drops, fast_drops,
                           slow_marks.marked, slow_marks.ect, fmt::join(gbit, " "));
  // Backs off: the link stays busy and its queue never overflows.
  EXPECT_GT(slow_median, 0.75 * kSlowGbit);
  EXPECT_LT(slow_median, 1.05 * kSlowGbit);
  const uint64_t packets_per_iteration = kSenders * (kElements / wire::kChunkElems);
  EXPECT_LE(slow_drops, packets_per_iteration / 100) << "the bottleneck's queue overflowed";
  EXPECT_LE(fast_drops, packets_per_iteration / 100) << "the bottleneck's queue overflowed";
  if (GetParam().ecn) {
    EXPECT_GT(slow_marks.ect, 10 * packets_per_iteration) << "DATA was not sent ECN-capable";
    EXPECT_GT(slow_marks.marked, 0u);
  }
  // Recovers: the windows open beyond what the old rate carried. (Not to the full new rate:
  // three workers and the aggregator at 1 Gbit/s need most of two shared vCPUs.)
  EXPECT_GT(fast_median, 1.2 * kSlowGbit);
  EXPECT_GT(fast_median, 1.2 * slow_median);
}

INSTANTIATE_TEST_SUITE_P(Signals, CongestionWindowE2e,
                         ::testing::Values(WindowCase{"EcnMarked", true}, WindowCase{"DelayOnly", false}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace xagg::testbed
