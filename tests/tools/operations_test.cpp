// What an operator reads from a running aggregator: its log as JSON lines
// (--log-format json) and its interface's own kernel counters in /metrics and
// `xagg stats`. The testbed tests need root; each test builds a testbed named
// after its pid, so they run in parallel with each other and other suites.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <spdlog/details/log_msg.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "cluster.h"
#include "log_format.h"
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
  cluster.stop_aggregator();
}

}  // namespace
}  // namespace xagg::tools
