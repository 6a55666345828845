// Least privilege: the daemon serves a real job as an unprivileged user holding
// only dataplane::kRequiredCapabilities (what the systemd unit grants), from a
// bpffs mounted with mode 0700 as systemd mounts it, the
// workers run with no capability at all, and a daemon missing any one of those
// capabilities refuses to start with a message naming it.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <unistd.h>

#include "cluster.h"
#include "dataplane.h"
#include "e2e_support.h"
#include "wire.h"

namespace xagg::testbed {
namespace {

constexpr uint32_t kWorkers = 2;

// setpriv's spelling of a capability set: "CAP_BPF" -> "+bpf".
std::string setpriv_caps(const std::vector<std::string>& names) {
  std::vector<std::string> items{"-all"};
  for (std::string name : names) {
    name.erase(0, 4);
    std::ranges::transform(name, name.begin(), [](unsigned char c) { return std::tolower(c); });
    items.push_back("+" + name);
  }
  return fmt::format("{}", fmt::join(items, ","));
}

// `command` as user nobody holding exactly `capabilities`.
std::vector<std::string> as_nobody(const std::vector<std::string>& capabilities,
                                   const std::vector<std::string>& command) {
  const std::string caps = setpriv_caps(capabilities);
  std::vector<std::string> argv{"setpriv",          "--reuid=nobody",          "--regid=nogroup",
                                "--clear-groups",   "--no-new-privs",          "--inh-caps=" + caps,
                                "--ambient-caps=" + caps, "--bounding-set=" + caps};
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

Process start_in_netns(const std::string& netns, const std::vector<std::string>& command) {
  std::vector<std::string> argv{"ip", "netns", "exec", netns};
  argv.insert(argv.end(), command.begin(), command.end());
  return Process(ProcessSpec{.argv = std::move(argv), .netns = std::nullopt, .output_file = std::nullopt});
}

// The shipped unit's ExecStartPre command (run as root: '+'), with this
// build's binary and `user` for the unit's user xagg.
std::string unit_preparation(const std::string& user) {
  std::ifstream file(XAGG_UNIT_FILE);
  const std::string prefix = "ExecStartPre=+@CMAKE_INSTALL_FULL_BINDIR@/xagg ";
  const std::string unit_user = "--prepare-for xagg";
  for (std::string line; std::getline(file, line);)
    if (line.starts_with(prefix) && line.ends_with(unit_user))
      return fmt::format("{} {}--prepare-for {}", XAGG_BINARY,
                         line.substr(prefix.size(), line.size() - prefix.size() - unit_user.size()), user);
  ADD_FAILURE() << "no `" << prefix << "... " << unit_user << "` line in " << XAGG_UNIT_FILE;
  return "false";
}

// The aggregator as the unit starts it, on a host as systemd leaves it: `ip
// netns exec` gives it a mount namespace of its own, where bpffs is mounted
// with mode 0700 as systemd mounts it and /run/xagg is provided as the unit's
// RuntimeDirectory= does. With `prepared`, root first runs the unit's
// ExecStartPre (`xagg aggregator --prepare-for`, for nobody).
Process start_daemon(const Testbed& bed, const std::vector<std::string>& capabilities, bool prepared = true,
                     const std::vector<std::string>& command = {"aggregator", "--interface", kHostInterface}) {
  std::string script =
      "mkdir -p /run/xagg && mount -t tmpfs -o mode=0700,uid=65534 tmpfs /run/xagg && "
      "mount -t bpf -o mode=0700 bpf /sys/fs/bpf && ";
  if (prepared) script += unit_preparation("nobody") + " && ";
  script += "exec \"$@\"";
  std::vector<std::string> argv{"sh", "-c", script, "sh"};
  std::vector<std::string> daemon{XAGG_BINARY};
  daemon.insert(daemon.end(), command.begin(), command.end());
  std::ranges::copy(as_nobody(capabilities, daemon), std::back_inserter(argv));
  return start_in_netns(bed.aggregator().netns, argv);
}

std::vector<std::string> required_names() {
  std::vector<std::string> names;
  for (const Capability& capability : dataplane::kRequiredCapabilities) names.emplace_back(capability.name);
  return names;
}

class PrivilegeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    e2e::require_root();
    bed_.up(kWorkers);
  }
  void TearDown() override { bed_.down(); }

  Testbed bed_{fmt::format("xagg-cap{}", getpid())};  // a prefix of its own: the tests run in parallel
};

TEST_F(PrivilegeTest, DaemonWithOnlyItsCapabilitiesServesUnprivilegedWorkers) {
  Process daemon = start_daemon(bed_, required_names());
  wait_for_tcp_port(bed_.aggregator().netns, bed_.aggregator().address, wire::kDefaultControlPort, daemon,
                    Clock::now() + std::chrono::seconds(20));
  std::vector<Process> workers;
  for (uint32_t rank = 0; rank < kWorkers; ++rank)
    workers.push_back(start_in_netns(
        bed_.worker(rank).netns,
        as_nobody({}, {XAGG_BINARY, "worker", "--aggregator", bed_.aggregator().address, "--job", "1", "--rank",
                       std::to_string(rank), "--world-size", std::to_string(kWorkers), "--elements", "200000",
                       "--iterations", "2", "--json"})));
  auto results = wait_all(workers, Clock::now() + std::chrono::seconds(60));
  ProcessResult served = daemon.terminate();
  SCOPED_TRACE("aggregator output:\n" + served.output);
  EXPECT_EQ(served.exit_code, 0);
  EXPECT_EQ(served.output.find("[error]"), std::string::npos);
  for (uint32_t rank = 0; rank < kWorkers; ++rank) {
    SCOPED_TRACE(fmt::format("rank {} output:\n{}", rank, results[rank].output));
    EXPECT_EQ(results[rank].exit_code, 0);
    auto reports = worker_reports(results[rank].output);
    ASSERT_EQ(reports.size(), 2u);
    for (const auto& report : reports) EXPECT_EQ(report.at("wrong").get<uint64_t>(), 0u) << report.dump();
  }
}

TEST_F(PrivilegeTest, DaemonMissingACapabilityRefusesNamingIt) {
  const std::vector<std::string> required = required_names();
  for (const std::string& missing : required) {
    std::vector<std::string> held;
    std::ranges::copy_if(required, std::back_inserter(held), [&](const std::string& name) { return name != missing; });
    ProcessResult refused = start_daemon(bed_, held).wait(Clock::now() + std::chrono::seconds(20));
    SCOPED_TRACE(fmt::format("without {} (exit {}):\n{}", missing, refused.exit_code, refused.output));
    EXPECT_FALSE(refused.timed_out);
    EXPECT_NE(refused.exit_code, 0);
    EXPECT_NE(refused.output.find("missing: " + missing), std::string::npos);
  }
}

// Without the unit's preparation, a 0700 bpffs stops the daemon before it
// loads anything, and the message and `xagg doctor` name the directory, its
// mode and the command that fixes it.
TEST_F(PrivilegeTest, UnpreparedBpffsIsNamedWithItsFix) {
  ProcessResult refused = start_daemon(bed_, required_names(), false).wait(Clock::now() + std::chrono::seconds(20));
  SCOPED_TRACE(fmt::format("daemon (exit {}):\n{}", refused.exit_code, refused.output));
  EXPECT_FALSE(refused.timed_out);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("uid 65534 cannot enter /sys/fs/bpf (mode 1700, owner uid 0)"), std::string::npos)
      << "bpffs sets the sticky bit on its root";
  EXPECT_NE(refused.output.find("xagg aggregator --prepare-for nobody"), std::string::npos);
  EXPECT_EQ(refused.output.find("filesystem error"), std::string::npos);

  ProcessResult doctor = start_daemon(bed_, required_names(), false, {"doctor", "--interface", kHostInterface, "--json"})
                             .wait(Clock::now() + std::chrono::seconds(30));
  SCOPED_TRACE(fmt::format("doctor (exit {}):\n{}", doctor.exit_code, doctor.output));
  EXPECT_EQ(doctor.exit_code, 1);
  // The report is stdout's one line; libbpf's messages go to stderr, also captured here.
  const std::string lines = "\n" + doctor.output;
  const size_t json_at = lines.rfind("\n{\"checks\"");
  ASSERT_NE(json_at, std::string::npos);
  const std::string json_line = lines.substr(json_at + 1);
  const nlohmann::json report = nlohmann::json::parse(json_line.substr(0, json_line.find('\n')));
  bool named = false;
  for (const nlohmann::json& check : report.at("checks"))
    if (check.at("check") == "bpffs") {
      EXPECT_EQ(check.at("status"), "FAIL") << check.dump();
      EXPECT_NE(check.at("found").get<std::string>().find("cannot enter /sys/fs/bpf (mode 1700"), std::string::npos);
      EXPECT_NE(check.at("fix").get<std::string>().find("--prepare-for nobody"), std::string::npos);
      named = true;
    }
  EXPECT_TRUE(named);
}

}  // namespace
}  // namespace xagg::testbed
