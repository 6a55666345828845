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
#include "testbed.h"

namespace xagg::tools {
namespace {

using namespace std::chrono_literals;
using testbed::Clock;

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
testbed::ProcessResult run_xagg(const std::vector<std::string>& arguments, const std::string& environment = "") {
  std::vector<std::string> argv{"env"};
  if (!environment.empty()) argv.push_back(environment);
  argv.push_back(XAGG_BINARY);
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  return testbed::Process({.argv = argv, .netns = std::nullopt, .output_file = std::nullopt})
      .wait(Clock::now() + 30s);
}

TEST(LogFormatOption, AnUnknownFormatIsRefusedSayingWhichAreKnown) {
  for (const auto& [arguments, environment] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--log-format", "xml", "stats", "--interface", "lo", "--count", "1"}, ""},
           {{"stats", "--interface", "lo", "--count", "1"}, "XAGG_LOG_FORMAT=xml"}}) {
    testbed::ProcessResult result = run_xagg(arguments, environment);
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
    testbed::ProcessResult result =
        testbed::Process({.argv = {"ip", "netns", "exec", bed_.worker(0).netns, "/usr/bin/python3", "-c", script},
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
  testbed::Process daemon({.argv = {"sh", "-c", "exec \"$@\" 2>" + stderr_file.string(), "sh", XAGG_BINARY,
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
  testbed::ProcessResult stopped = daemon.terminate();
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

}  // namespace
}  // namespace xagg::tools
