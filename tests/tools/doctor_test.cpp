// The real `xagg doctor` against the aggregator's veth of a one-worker
// testbed (needs root). Each test has a testbed of its own, named after its
// pid, so the tests can run in parallel with each other and with other suites.
#include <bpf/libbpf.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>

#include "testbed.h"
#include "wire.h"
#include "xagg_pass.skel.h"

namespace xagg::tools {
namespace {

using namespace std::chrono_literals;

struct DoctorRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr

  // The line of one check ("OK    mtu  ..."), empty when there is none.
  std::string line(const std::string& check) const {
    std::smatch match;
    std::regex pattern("^(OK|WARN|FAIL) +" + check + "  .*$", std::regex::multiline);
    return std::regex_search(output, match, pattern) ? match.str() : "";
  }
};

class DoctorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Fails (never skips): a suite that silently skips would hide a broken CI setup.
    ASSERT_EQ(geteuid(), 0u) << "the doctor tests create network namespaces and attach XDP programs: run them as root";
    bed_.up(1);
  }

  // Removes the namespaces, and with them the veths, XDP programs and nft tables, also after a failure.
  void TearDown() override { bed_.down(); }

  const testbed::HostLink& aggregator() const { return aggregator_; }

  DoctorRun run_doctor(std::vector<std::string> extra_arguments = {}) {
    std::vector<std::string> argv{XAGG_BINARY, "doctor", "--interface", aggregator_.interface};
    argv.insert(argv.end(), extra_arguments.begin(), extra_arguments.end());
    xagg::Process doctor({.argv = argv, .netns = aggregator_.netns, .output_file = {}});
    xagg::ProcessResult result = doctor.wait(xagg::Clock::now() + 60s);
    EXPECT_FALSE(result.timed_out) << result.output;
    return {result.exit_code, result.output};
  }

  void in_aggregator_netns(const std::vector<std::string>& command) {
    std::vector<std::string> argv{"ip", "netns", "exec", aggregator_.netns};
    argv.insert(argv.end(), command.begin(), command.end());
    xagg::run_command(argv);
  }

  testbed::Testbed bed_{fmt::format("xagg-doctor{}", getpid())};
  testbed::HostLink aggregator_ = bed_.aggregator(0);
};

TEST_F(DoctorTest, HealthyVethPasses) {
  DoctorRun run = run_doctor();
  EXPECT_EQ(run.exit_code, 0) << run.output;
  for (const char* check :
       {"interface", "mtu", "xdp program", "xdp native", "xdp multi-buffer", "data plane", "control port"})
    EXPECT_TRUE(run.line(check).starts_with("OK")) << check << ":\n" << run.output;
  EXPECT_NE(run.line("xdp native").find("attached to eth0 in native mode"), std::string::npos) << run.output;

  DoctorRun generic = run_doctor({"--generic", "--json"});
  EXPECT_EQ(generic.exit_code, 0) << generic.output;
  std::smatch json_line;  // the report's one line, among libbpf's messages on stderr
  ASSERT_TRUE(std::regex_search(generic.output, json_line, std::regex("^\\{.*$", std::regex::multiline)))
      << generic.output;
  nlohmann::json report = nlohmann::json::parse(json_line.str());
  EXPECT_TRUE(report["ok"].get<bool>());
  bool generic_attached = false;
  for (const auto& check : report["checks"])
    generic_attached = generic_attached || (check["check"] == "xdp generic" && check["status"] == "OK");
  EXPECT_TRUE(generic_attached) << generic.output;
}

TEST_F(DoctorTest, MtuBelowTheNeedFailsNamingBoth) {
  in_aggregator_netns({"ip", "link", "set", "dev", aggregator().interface, "mtu", "1200"});
  DoctorRun run = run_doctor();
  EXPECT_EQ(run.exit_code, 1) << run.output;
  std::string mtu = run.line("mtu");
  EXPECT_TRUE(mtu.starts_with("FAIL")) << run.output;
  EXPECT_NE(mtu.find("MTU 1200"), std::string::npos) << mtu;
  EXPECT_NE(mtu.find(std::to_string(wire::kMinLinkMtu)), std::string::npos) << mtu;
}

TEST_F(DoctorTest, StandardMtuWarnsOfSmallerChunks) {
  in_aggregator_netns({"ip", "link", "set", "dev", aggregator().interface, "mtu", "1500"});
  DoctorRun run = run_doctor();
  std::string mtu = run.line("mtu");
  EXPECT_TRUE(mtu.starts_with("WARN")) << run.output;
  EXPECT_NE(mtu.find("at most 360 elements"), std::string::npos) << mtu;
}

TEST_F(DoctorTest, AnotherXdpProgramFailsNamingItsId) {
  uint32_t program_id = 0;
  testbed::run_in_netns(aggregator().netns, [&] {
    int ifindex = static_cast<int>(if_nametoindex(aggregator().interface.c_str()));
    ASSERT_NE(ifindex, 0);
    std::unique_ptr<xagg_pass_bpf, decltype(&xagg_pass_bpf__destroy)> skeleton(xagg_pass_bpf__open_and_load(),
                                                                               &xagg_pass_bpf__destroy);
    ASSERT_TRUE(skeleton);
    // A netlink attachment: it stays after the skeleton is closed, as `ip link set ... xdp` would.
    ASSERT_EQ(bpf_xdp_attach(ifindex, bpf_program__fd(skeleton->progs.xagg_pass), XDP_FLAGS_DRV_MODE, nullptr), 0);
    ASSERT_EQ(bpf_xdp_query_id(ifindex, XDP_FLAGS_DRV_MODE, &program_id), 0);
  });
  DoctorRun run = run_doctor();
  EXPECT_EQ(run.exit_code, 1) << run.output;
  std::string program = run.line("xdp program");
  EXPECT_TRUE(program.starts_with("FAIL")) << run.output;
  EXPECT_NE(program.find(fmt::format("XDP program {} 'xagg_pass'", program_id)), std::string::npos) << program;
  EXPECT_NE(program.find("xdpdrv off"), std::string::npos) << program;
}

TEST_F(DoctorTest, FirewallOnDataPortDoesNotMatterOnControlPortFails) {
  ASSERT_EQ(std::system("command -v nft >/dev/null"), 0) << "nft is missing: run scripts/install-deps.sh";
  in_aggregator_netns({"nft", "add", "table", "inet", "doctor_test"});
  in_aggregator_netns(
      {"nft", "add", "chain", "inet", "doctor_test", "input", "{ type filter hook input priority 0; policy accept; }"});
  in_aggregator_netns({"nft", "add", "rule", "inet", "doctor_test", "input", "udp", "dport",
                       std::to_string(wire::kDefaultDataPort), "drop"});
  DoctorRun data_blocked = run_doctor();
  EXPECT_EQ(data_blocked.exit_code, 0) << data_blocked.output;
  std::string data = data_blocked.line("firewall data");
  EXPECT_TRUE(data.starts_with("OK")) << data_blocked.output;
  EXPECT_NE(data.find("rule 'inet doctor_test input handle"), std::string::npos) << data;
  EXPECT_NE(data.find("before netfilter"), std::string::npos) << data;

  in_aggregator_netns({"nft", "add", "rule", "inet", "doctor_test", "input", "tcp", "dport",
                       std::to_string(wire::kDefaultControlPort), "reject"});
  DoctorRun control_blocked = run_doctor();
  EXPECT_EQ(control_blocked.exit_code, 1) << control_blocked.output;
  std::string control = control_blocked.line("firewall control");
  EXPECT_TRUE(control.starts_with("FAIL")) << control_blocked.output;
  EXPECT_NE(control.find("rejects it"), std::string::npos) << control;
  EXPECT_NE(control.find("nft delete rule inet doctor_test input handle"), std::string::npos) << control;
}

}  // namespace
}  // namespace xagg::tools
