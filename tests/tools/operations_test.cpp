// What an operator reads from a running aggregator: its log as JSON lines
// (--log-format json) and its interface's own kernel counters in /metrics and
// `xagg stats`; /metrics and /healthz answering whatever clients hold open,
// /healthz telling a stuck control loop, the log limited per peer, refused
// joins counted by reason. The testbed tests need root; each test builds a testbed named
// after its pid, so they run in parallel with each other and other suites.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <spdlog/details/log_msg.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "cluster.h"
#include "control_messages.h"
#include "log_format.h"
#include "metrics.h"
#include "peer_log_limit.h"
#include "reliability_support.h"
#include "testbed.h"

namespace xagg::tools {
namespace {

using namespace std::chrono_literals;
using reliability::series;
using xagg::Clock;

const std::regex kRfc3339Micros(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)");

// Every line of `text` as a JSON object; a line that is not one fails the test, naming it.
std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) {
    nlohmann::json object = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(object.is_object()) << "not a JSON object: " << line;
    if (object.is_object()) lines.push_back(std::move(object));
  }
  return lines;
}

TEST(JsonLogFormatter, EscapesWhateverAMessageHoldsIntoOneLine) {
  const std::string payload = "peer said \"hi\"\nthen \x01 and \\ and bytes \xff\xfe that are not UTF-8";
  spdlog::details::log_msg message(spdlog::source_loc{}, "aggregator", spdlog::level::warn, payload);
  message.time = std::chrono::system_clock::time_point(std::chrono::microseconds(1'796'504'286'000'042));
  spdlog::memory_buf_t buffer;
  JsonLogFormatter().format(message, buffer);
  const std::string text(buffer.data(), buffer.size());
  ASSERT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  ASSERT_TRUE(text.ends_with("\n")) << text;
  const nlohmann::json line = nlohmann::json::parse(text);
  EXPECT_EQ(line.at("time"), "2026-12-05T20:58:06.000042Z");
  EXPECT_EQ(line.at("level"), "warning");
  EXPECT_EQ(line.at("component"), "aggregator");
  EXPECT_EQ(line.at("pid"), getpid());
  // The invalid bytes become U+FFFD each; everything else comes back as it was.
  EXPECT_EQ(line.at("message"), "peer said \"hi\"\nthen \x01 and \\ and bytes \xef\xbf\xbd\xef\xbf\xbd that are not UTF-8");
}

// Runs `xagg` with these arguments (and environment) to completion; stdout and stderr together.
xagg::ProcessResult run_xagg(const std::vector<std::string>& arguments, const std::string& environment = "") {
  std::vector<std::string> argv{"env"};
  if (!environment.empty()) argv.push_back(environment);
  argv.push_back(XAGG_BINARY);
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  return xagg::Process({.argv = argv, .netns = std::nullopt, .output_file = std::nullopt})
      .wait(Clock::now() + 30s);
}

TEST(LogFormatOption, AnUnknownFormatIsRefusedSayingWhichAreKnown) {
  for (const auto& [arguments, environment] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--log-format", "xml", "stats", "--interface", "lo", "--count", "1"}, ""},
           {{"stats", "--interface", "lo", "--count", "1"}, "XAGG_LOG_FORMAT=xml"}}) {
    xagg::ProcessResult result = run_xagg(arguments, environment);
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("unknown log format 'xml': use text or json"), std::string::npos) << result.output;
  }
}

class OperationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Fails (never skips): a suite that silently skips would hide a broken CI setup.
    ASSERT_EQ(geteuid(), 0u) << "these tests create network namespaces and attach XDP programs: run them as root";
  }
  // Removes the namespaces, and with them the veths and XDP programs, also after a failure.
  void TearDown() override { bed_.down(); }

  // A Python client run in worker 0's namespace; its output.
  std::string run_client(const std::string& script) {
    xagg::ProcessResult result =
        xagg::Process({.argv = {"ip", "netns", "exec", bed_.worker(0).netns, "/usr/bin/python3", "-c", script},
                          .netns = std::nullopt,
                          .output_file = std::nullopt})
            .wait(Clock::now() + 30s);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return result.output;
  }

  testbed::Testbed bed_{fmt::format("xops{}", getpid())};
};

// The daemon under --log-format json: every line on stderr is one JSON object,
// nothing goes to stdout, and peer-supplied text (quotes, newlines, control
// characters, bytes that are not UTF-8) stays inside its line's message.
TEST_F(OperationsTest, JsonLogLinesHoldWhateverPeersSend) {
  bed_.up(1);
  const testbed::HostLink aggregator = bed_.aggregator(0);
  const std::filesystem::path stderr_file =
      std::filesystem::temp_directory_path() / fmt::format("xagg-json-log-{}.txt", getpid());
  struct RemoveFile {
    std::filesystem::path path;
    ~RemoveFile() { std::filesystem::remove(path); }
  } remove_stderr_file{stderr_file};
  // sh only splits stderr off (Process captures both streams together); exec keeps the daemon's pid.
  xagg::Process daemon({.argv = {"sh", "-c", "exec \"$@\" 2>" + stderr_file.string(), "sh", XAGG_BINARY,
                                    "--log-format", "json", "aggregator", "--interface", aggregator.interface,
                                    "--netns", aggregator.netns},
                           .netns = std::nullopt,
                           .output_file = std::nullopt});
  testbed::wait_for_tcp_port(aggregator.netns, aggregator.address, 9988, daemon, Clock::now() + 30s);
  run_client(fmt::format(
      "import socket\n"
      "reporter = socket.create_connection(('{0}', 9988), timeout=10)\n"
      "reporter.sendall(b'{{\"type\":\"error\",\"message\":\"he said \\\\\"stop\\\\\"\\\\nthen left \\\\u0001\"}}\\n')\n"
      "reporter.recv(4096)\n"
      "garbage = socket.create_connection(('{0}', 9988), timeout=10)\n"
      "garbage.sendall(b'\\xff\\xfe{{\"not json\\n')\n"
      "print(garbage.recv(4096))\n",
      aggregator.address));
  xagg::ProcessResult stopped = daemon.terminate();
  EXPECT_EQ(stopped.exit_code, 0) << stopped.output;
  EXPECT_EQ(stopped.output, "") << "stdout is not the log's";

  std::ifstream file(stderr_file);
  const std::string log((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const std::vector<nlohmann::json> lines = json_lines(log);
  bool reported = false, refused = false, stopped_line = false;
  for (const nlohmann::json& line : lines) {
    ASSERT_TRUE(line.contains("time") && line.contains("level") && line.contains("component") &&
                line.contains("pid") && line.contains("message"))
        << line.dump();
    EXPECT_TRUE(std::regex_match(line.at("time").get<std::string>(), kRfc3339Micros)) << line.dump();
    EXPECT_EQ(line.at("component"), "aggregator") << line.dump();
    EXPECT_EQ(line.at("pid"), daemon.pid()) << line.dump();
    const std::string message = line.at("message");
    if (message.ends_with(fmt::format("from {} reported: he said \"stop\"\nthen left \x01", bed_.worker(0).address)))
      reported = line.at("level") == "warning";
    if (message.find(fmt::format("from {}: ", bed_.worker(0).address)) != std::string::npos &&
        message.find("JSON") != std::string::npos)
      refused = line.at("level") == "warning";
    stopped_line |= message == "aggregator stopped";
  }
  EXPECT_TRUE(reported) << "no warning with the peer's error message as it sent it:\n" << log;
  EXPECT_TRUE(refused) << "no warning about the line that is not JSON:\n" << log;
  EXPECT_TRUE(stopped_line) << log;
}

// `ip -s -s -j link show` of the aggregator's interface, as {"rx_packets": N, ...}.
std::map<std::string, uint64_t> ip_link_counters(const testbed::HostLink& host) {
  const nlohmann::json links = nlohmann::json::parse(
      xagg::run_command({"ip", "-n", host.netns, "-s", "-s", "-j", "link", "show", "dev", host.interface}));
  std::map<std::string, uint64_t> counters;
  for (const char* direction : {"rx", "tx"})
    for (const auto& [name, value] : links.at(0).at("stats64").at(direction).items())
      counters[fmt::format("{}_{}", direction, name)] = value.get<uint64_t>();
  return counters;
}

// After a job's traffic, the interface counters that /metrics and `xagg stats`
// report are the kernel's, as `ip -s -s link` shows them in the daemon's
// namespace: between two readings of ip taken before and after theirs (the
// host may send a frame meanwhile), and every frame XDP counted is in them.
TEST_F(OperationsTest, InterfaceCountersAreThoseIpLinkShows) {
  bed_.up(2);
  const testbed::HostLink aggregator = bed_.aggregator(0);
  testbed::Cluster cluster(XAGG_BINARY, bed_);
  cluster.start_aggregator(Clock::now() + 30s);  // with --metrics on the aggregator's address
  testbed::JobSpec job;
  job.workers = 2;
  job.elements = 300000;
  job.iterations = 3;
  for (const xagg::ProcessResult& worker : cluster.run_workers(job, Clock::now() + 60s))
    ASSERT_EQ(worker.exit_code, 0) << worker.output;

  const std::map<std::string, uint64_t> before = ip_link_counters(aggregator);
  std::this_thread::sleep_for(1200ms);  // the daemon refreshes /metrics once a second
  const std::string scrape = run_client(fmt::format(
      "import urllib.request\n"
      "print(urllib.request.urlopen('http://{}:9989/metrics', timeout=10).read().decode(), end='')\n",
      aggregator.address));
  xagg::ProcessResult stats = xagg::Process({.argv = {XAGG_BINARY, "stats", "--interface", aggregator.interface,
                                                            "--count", "1", "--json"},
                                                   .netns = aggregator.netns,
                                                   .output_file = std::nullopt})
                                     .wait(Clock::now() + 30s);
  const std::map<std::string, uint64_t> after = ip_link_counters(aggregator);
  ASSERT_EQ(stats.exit_code, 0) << stats.output;
  const std::vector<nlohmann::json> reports = testbed::worker_reports(stats.output);
  ASSERT_EQ(reports.size(), 1u) << stats.output;
  const nlohmann::json& interface = reports.front().at("interface");
  EXPECT_EQ(interface.at("name"), aggregator.interface);

  for (const char* name : {"rx_packets", "rx_bytes", "rx_errors", "rx_dropped", "rx_missed_errors", "rx_fifo_errors",
                           "rx_over_errors", "rx_length_errors", "rx_crc_errors", "rx_frame_errors", "tx_packets",
                           "tx_bytes", "tx_errors", "tx_dropped", "tx_fifo_errors", "tx_carrier_errors"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(before.contains(name) && after.contains(name)) << "ip does not show it";
    const double metric =
        series(scrape, fmt::format("xagg_interface_{}_total{{interface=\"{}\"}}", name, aggregator.interface));
    EXPECT_GE(metric, before.at(name)) << scrape;
    EXPECT_LE(metric, after.at(name)) << scrape;
    const uint64_t shown = interface.at("counters").at(name);
    EXPECT_GE(shown, before.at(name)) << stats.output;
    EXPECT_LE(shown, after.at(name)) << stats.output;
  }
  // The job's DATA frames all passed the interface's counters on their way to XDP.
  double data_frames = 0;
  for (const char* outcome : {"aggregated", "completed", "duplicate", "resent"})
    data_frames += series(scrape, fmt::format("xagg_packets_total{{outcome=\"{}\"}}", outcome));
  EXPECT_GT(data_frames, 2 * 3 * (300000 / 2048)) << scrape;
  EXPECT_GE(series(scrape, fmt::format("xagg_interface_rx_packets_total{{interface=\"{}\"}}", aggregator.interface)),
            data_frames)
      << scrape;
  const ProcessResult stopped = cluster.stop_aggregator();
  EXPECT_EQ(stopped.output.find("[warning]"), std::string::npos) << "a job served normally warns of nothing:\n"
                                                                  << stopped.output;
}

// The metrics server, /healthz, the log limit and the join counters are the
// control plane's, the same over either engine; the user-space one keeps
// these tests independent of what the kernel's XDP can do.
constexpr testbed::AggregatorKind kControlPlaneOnly = testbed::AggregatorKind::Userspace;

// A Python client's helpers: an HTTP exchange on a fresh connection (the
// response whole, up to the server's close) and a join on a fresh control
// connection (the connection and the reply's first line).
std::string python_helpers(const std::string& aggregator) {
  return fmt::format(
      "import json, socket, time\n"
      "AGG = '{}'\n"
      "def ask(raw, port=9989):\n"
      "    s = socket.create_connection((AGG, port), timeout=10)\n"
      "    s.sendall(raw)\n"
      "    data = b''\n"
      "    while True:\n"
      "        chunk = s.recv(65536)\n"
      "        if not chunk: break\n"
      "        data += chunk\n"
      "    s.close()\n"
      "    return data\n"
      "def status(raw):\n"
      "    return ask(raw).split(b'\\r\\n', 1)[0].decode()\n"
      "def join(job, rank, world_size, mtu=9000):\n"
      "    s = socket.create_connection((AGG, 9988), timeout=10)\n"
      "    s.sendall((json.dumps({{'type': 'join', 'version': {}, 'job': job, 'rank': rank,\n"
      "                           'world_size': world_size, 'elements': 1000, 'mtu': mtu}}) + '\\n').encode())\n"
      "    return s, s.makefile().readline()\n",
      aggregator, control::kProtocolVersion);
}

// 256 connections held open, half idle, half with a request begun and never
// finished, delay neither a scrape (under a second) nor any answer: every
// method on every path gets a status line.
TEST_F(OperationsTest, MetricsAnswerEveryRequestWhile256ConnectionsHang) {
  bed_.up(1);
  testbed::Cluster cluster(XAGG_BINARY, bed_);
  cluster.start_aggregator(Clock::now() + 30s, kControlPlaneOnly);  // with --metrics on the aggregator's address
  std::this_thread::sleep_for(1200ms);                               // the first refresh after the start
  const std::string output = run_client(python_helpers(bed_.aggregator(0).address) + R"(
held = [socket.create_connection((AGG, 9989), timeout=10) for _ in range(128)]
for _ in range(128):
    s = socket.create_connection((AGG, 9989), timeout=10)
    s.sendall(b'GET /metrics HTTP/1.1\r\nHost: aggregator\r\n')
    held.append(s)
start = time.monotonic()
scrape = ask(b'GET /metrics HTTP/1.1\r\nHost: aggregator\r\n\r\n')
elapsed = time.monotonic() - start
statuses = {}
for method in ['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'OPTIONS', 'PATCH', 'BREW']:
    for path in ['/metrics', '/healthz', '/other']:
        statuses[method + ' ' + path] = status(
            (method + ' ' + path + ' HTTP/1.1\r\nHost: aggregator\r\nContent-Length: 5\r\n\r\nhello').encode())
statuses['garbage'] = status(b'\x16\x03\x01 not http\r\n\r\n')
statuses['oversized'] = status(b'GET /metrics HTTP/1.1\r\nX: ' + b'a' * 20000 + b'\r\n\r\n')
print(json.dumps({'seconds': elapsed, 'scrape': scrape.decode(), 'statuses': statuses}))
)");
  const nlohmann::json result = nlohmann::json::parse(output.substr(output.find('{')));
  const std::string scrape = result.at("scrape");
  std::printf("scrape with 256 connections hanging: %.3f s\n", result.at("seconds").get<double>());
  EXPECT_LT(result.at("seconds").get<double>(), 1.0) << "a scrape waited behind connections that send nothing";
  EXPECT_TRUE(scrape.starts_with("HTTP/1.1 200 OK\r\n")) << scrape.substr(0, 200);
  EXPECT_NE(scrape.find("\r\n\r\n# HELP xagg_uptime_seconds"), std::string::npos) << scrape.substr(0, 400);
  const nlohmann::json& statuses = result.at("statuses");
  for (const auto& [request, line] : statuses.items()) {
    SCOPED_TRACE(request);
    const std::string method = request.substr(0, request.find(' '));
    std::string expected = "HTTP/1.1 405 Method Not Allowed";
    if (request.ends_with("/other")) expected = "HTTP/1.1 404 Not Found";
    else if (method == "GET" || method == "HEAD") expected = "HTTP/1.1 200 OK";
    if (request == "garbage") expected = "HTTP/1.1 400 Bad Request";
    if (request == "oversized") expected = "HTTP/1.1 431 Request Header Fields Too Large";
    EXPECT_EQ(line, expected);
  }
  EXPECT_EQ(statuses.size(), 8u * 3 + 2);
  const ProcessResult stopped = cluster.stop_aggregator();
  EXPECT_EQ(stopped.exit_code, 0);
  EXPECT_EQ(stopped.output.find("[warning]"), std::string::npos) << "a normal start and stop warn of nothing:\n"
                                                                  << stopped.output;
}

// A memory quota above the host's memory, and an interface whose MTU no job
// could use, are refused before anything is loaded, with the figures.
TEST_F(OperationsTest, QuotaAboveMemoryAndMtuBelowTheFloorAreRefused) {
  bed_.up(1);
  const testbed::HostLink aggregator = bed_.aggregator(0);
  std::ifstream meminfo("/proc/meminfo");
  std::string name;
  uint64_t total_kib = 0;
  meminfo >> name >> total_kib;
  ASSERT_EQ(name, "MemTotal:");
  const uint64_t quota = total_kib * 1024 + 1;
  auto start = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> argv{XAGG_BINARY, "aggregator", "--interface", aggregator.interface};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return Process({.argv = argv, .netns = aggregator.netns, .output_file = std::nullopt})
        .wait(Clock::now() + 30s);
  };
  const ProcessResult over_quota = start({"--memory-quota", std::to_string(quota)});
  EXPECT_NE(over_quota.exit_code, 0);
  EXPECT_NE(over_quota.output.find(fmt::format("--memory-quota {} bytes", quota)), std::string::npos)
      << over_quota.output;
  EXPECT_NE(over_quota.output.find(fmt::format("exceeds this host's memory, {} bytes", total_kib * 1024)),
            std::string::npos)
      << over_quota.output;

  run_command({"ip", "-n", aggregator.netns, "link", "set", "dev", aggregator.interface, "mtu", "1200"});
  const ProcessResult low_mtu = start({});
  EXPECT_NE(low_mtu.exit_code, 0);
  EXPECT_NE(low_mtu.output.find(fmt::format("interface {} has MTU 1200, below the 1280", aggregator.interface)),
            std::string::npos)
      << low_mtu.output;
}

// The daemon's control loop, and only it, stopped in place (ptrace stops one
// thread; the metrics thread runs on): /healthz answers 503 within
// MetricsServer::kStaleAfter plus one refresh, and 200 again once it runs.
TEST_F(OperationsTest, HealthzTellsAStuckControlLoopWithinItsBound) {
  bed_.up(1);
  testbed::Cluster cluster(XAGG_BINARY, bed_);
  cluster.start_aggregator(Clock::now() + 30s, kControlPlaneOnly);
  std::this_thread::sleep_for(1200ms);
  const std::string helpers = python_helpers(bed_.aggregator(0).address);
  // Polls /healthz every 100 ms until its status is `wanted` (15 s at most): the seconds it took, the answer.
  const std::string poll_until = helpers + R"(
import sys
start = time.monotonic()
while True:
    answer = ask(b'GET /healthz HTTP/1.1\r\nHost: aggregator\r\n\r\n').decode()
    if answer.split(' ')[1] == sys.argv[1] or time.monotonic() - start > 15: break
    time.sleep(0.1)
print(json.dumps({'seconds': time.monotonic() - start, 'answer': answer}))
)";
  auto poll = [&](const std::string& wanted) {
    ProcessResult result =
        Process({.argv = {"ip", "netns", "exec", bed_.worker(0).netns, "/usr/bin/python3", "-c", poll_until,
                                   wanted},
                          .netns = std::nullopt,
                          .output_file = std::nullopt})
            .wait(Clock::now() + 30s);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return nlohmann::json::parse(result.output.substr(result.output.find('{')));
  };
  const nlohmann::json healthy = poll("200");
  ASSERT_LT(healthy.at("seconds").get<double>(), 1.0) << healthy.dump();
  EXPECT_NE(healthy.at("answer").get<std::string>().find("\r\n\r\nok\n"), std::string::npos) << healthy.dump();

  const pid_t control_loop = cluster.aggregator_pid();  // the main thread runs the control loop
  ASSERT_EQ(ptrace(PTRACE_SEIZE, control_loop, nullptr, nullptr), 0) << std::strerror(errno);
  ASSERT_EQ(ptrace(PTRACE_INTERRUPT, control_loop, nullptr, nullptr), 0) << std::strerror(errno);
  int wait_status = 0;
  ASSERT_EQ(waitpid(control_loop, &wait_status, __WALL), control_loop);
  const auto stopped_at = Clock::now();
  const nlohmann::json stuck = poll("503");
  const double seconds_to_unhealthy = std::chrono::duration<double>(Clock::now() - stopped_at).count();
  EXPECT_EQ(ptrace(PTRACE_DETACH, control_loop, nullptr, nullptr), 0) << std::strerror(errno);
  std::printf("control loop stopped: /healthz 503 after %.2f s\n", seconds_to_unhealthy);
  EXPECT_TRUE(stuck.at("answer").get<std::string>().starts_with("HTTP/1.1 503")) << stuck.dump();
  EXPECT_NE(stuck.at("answer").get<std::string>().find("control loop stuck"), std::string::npos) << stuck.dump();
  const double bound = std::chrono::duration<double>(control::MetricsServer::kStaleAfter).count() + 1.0;
  EXPECT_LE(seconds_to_unhealthy, bound + 1.0) << "the poller's start and its 100 ms steps aside";
  EXPECT_GE(stuck.at("seconds").get<double>(), bound - 2.0) << "unhealthy before the loop was stale";

  const nlohmann::json recovered = poll("200");
  EXPECT_LT(recovered.at("seconds").get<double>(), 3.0) << recovered.dump();
  EXPECT_EQ(cluster.stop_aggregator().exit_code, 0);
}

// Sums the counts of the daemon's "N log lines caused by ADDRESS suppressed" lines about `address`.
uint64_t reported_suppressed(const std::string& log, const std::string& address) {
  const std::regex report(R"((\d+) log lines caused by ([0-9.]+) suppressed)");
  uint64_t total = 0;
  for (std::sregex_iterator it(log.begin(), log.end(), report), end; it != end; ++it)
    if ((*it)[2] == address) total += std::stoull((*it)[1]);
  return total;
}

// One host joining and closing as fast as it can writes at most the per-peer
// budget to the log; what it exceeds is counted, in the log and in /metrics,
// and refused joins are counted by reason.
TEST_F(OperationsTest, OnePeerCannotFloodTheLogAndRefusalsAreCountedByReason) {
  bed_.up(1);
  testbed::Cluster cluster(XAGG_BINARY, bed_);
  cluster.start_aggregator(Clock::now() + 30s, kControlPlaneOnly);
  const std::string before = cluster.aggregator_output();
  const std::string output = run_client(python_helpers(bed_.aggregator(0).address) + R"(
refusals = {}
for name, args in [('invalid', (7, 0, 0)), ('invalid', (7, 3, 2)), ('mtu', (7, 0, 2, 1000))]:
    s, reply = join(*args)
    refusals.setdefault(name, []).append(reply)
    s.close()
held, reply = join(8, 0, 2)
again, refusal = join(8, 0, 2)
refusals['mismatch'] = [refusal]
start = time.monotonic()
for job in range(300):
    s, reply = join(100 + job, 0, 2)
    s.close()
print(json.dumps({'seconds': time.monotonic() - start, 'refusals': refusals}))
)");
  const nlohmann::json result = nlohmann::json::parse(output.substr(output.find('{')));
  for (const auto& [reason, replies] : result.at("refusals").items())
    for (const auto& reply : replies) EXPECT_NE(reply.get<std::string>().find("\"error\""), std::string::npos) << reason;
  std::this_thread::sleep_for(1500ms);  // the daemon has seen every close and refreshed /metrics
  const std::string scrape = run_client(fmt::format(
      "import urllib.request\n"
      "print(urllib.request.urlopen('http://{}:9989/metrics', timeout=10).read().decode(), end='')\n",
      bed_.aggregator(0).address));
  const ProcessResult stopped = cluster.stop_aggregator();
  EXPECT_EQ(stopped.exit_code, 0);
  const std::string log = stopped.output.substr(before.size());
  const double seconds = result.at("seconds").get<double>() + 2.0;  // and the refusals before, and the closes after

  const size_t lines = static_cast<size_t>(std::ranges::count(log, '\n'));
  const double budget = control::PeerLogLimit::kBurst + control::PeerLogLimit::kLinesPerSecond * seconds;
  std::printf("300 joins and closes from one peer in %.2f s: %zu log lines (budget %.0f)\n", seconds - 2.0, lines,
              budget);
  EXPECT_LE(lines, budget + 10) << "the peer's budget, its suppression reports and the stop's lines:\n" << log;
  const double suppressed = series(scrape, "xagg_log_lines_suppressed_total");
  EXPECT_GE(suppressed, 300.0) << "each join and close logs more than one line";
  EXPECT_EQ(reported_suppressed(log, bed_.worker(0).address), suppressed)
      << "every suppressed line is reported, at the latest when the daemon stops:\n" << log;

  EXPECT_EQ(series(scrape, "xagg_joins_refused_total{reason=\"invalid\"}"), 2) << scrape;
  EXPECT_EQ(series(scrape, "xagg_joins_refused_total{reason=\"mtu\"}"), 1) << scrape;
  EXPECT_EQ(series(scrape, "xagg_joins_refused_total{reason=\"mismatch\"}"), 1) << scrape;
  EXPECT_EQ(series(scrape, "xagg_joins_refused_total{reason=\"memory\"}"), 0) << scrape;
  // A flooding source's joins may also meet its limit of joins of jobs not started (capacity).
  double refused = 0;
  for (const char* reason : {"invalid", "mtu", "subnet", "capacity", "memory", "mismatch"})
    refused += series(scrape, fmt::format("xagg_joins_refused_total{{reason=\"{}\"}}", reason));
  EXPECT_EQ(series(scrape, "xagg_joins_total{result=\"refused\"}"), refused) << scrape;
  EXPECT_EQ(series(scrape, "xagg_joins_total{result=\"accepted\"}") + refused, 305) << scrape;
}

// With a cluster secret, a worker that has none reads the challenge and
// hangs up: that is a refused join, counted and logged at the default level.
TEST_F(OperationsTest, AJoinWithoutTheSecretIsCountedAndLogged) {
  bed_.up(1);
  const testbed::HostLink aggregator = bed_.aggregator(0);
  const std::filesystem::path secret = std::filesystem::temp_directory_path() / fmt::format("xagg-secret-{}", getpid());
  struct RemoveFile {
    std::filesystem::path path;
    ~RemoveFile() { std::filesystem::remove(path); }
  } remove_secret{secret};
  std::ofstream(secret) << "an operations test secret of enough bytes\n";
  std::filesystem::permissions(secret, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  Process daemon({.argv = {XAGG_BINARY, "aggregator", "--interface", aggregator.interface, "--metrics",
                                    aggregator.address, "--secret-file", secret.string(), "--engine", "userspace"},
                           .netns = aggregator.netns,
                           .output_file = std::nullopt});
  testbed::wait_for_tcp_port(aggregator.netns, aggregator.address, 9988, daemon, Clock::now() + 30s);
  const std::string output = run_client(python_helpers(aggregator.address) + R"(
s, challenge = join(1, 0, 2)
s.close()
time.sleep(1.5)
print(challenge)
print(ask(b'GET /metrics HTTP/1.1\r\nHost: aggregator\r\n\r\n').decode())
)");
  EXPECT_NE(output.find("\"challenge\""), std::string::npos) << output;
  EXPECT_EQ(series(output, "xagg_joins_refused_total{reason=\"unauthenticated\"}"), 1) << output;
  EXPECT_EQ(series(output, "xagg_joins_total{result=\"unauthenticated\"}"), 1) << output;
  const ProcessResult stopped = daemon.terminate();
  EXPECT_NE(stopped.output.find(fmt::format("from {}: join not authenticated (closed after the challenge",
                                            bed_.worker(0).address)),
            std::string::npos)
      << stopped.output;
  EXPECT_NE(stopped.output.find("[warning]"), std::string::npos) << stopped.output;
}

}  // namespace
}  // namespace xagg::tools
