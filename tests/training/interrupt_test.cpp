// An interrupted training run cleans up: SIGINT (Ctrl-C), SIGTERM or SIGHUP stops its
// ranks and its aggregator and removes its testbed, and the run exits non-zero
// saying so, rather than dying with its namespaces and daemons left behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "process.h"

namespace {

using xagg::Clock;

constexpr const char* kPrefix = "xtrain-int";

bool namespaces_left() {
  return xagg::run_command({"ip", "netns", "list"}).find(std::string(kPrefix) + "-") != std::string::npos;
}

TEST(InterruptedTraining, StopsAndRemovesItsTestbed) {
  if (geteuid() != 0) GTEST_FAIL() << "the training tests need root (network namespaces, XDP)";
  for (int signal_number : {SIGINT, SIGTERM, SIGHUP}) {
    SCOPED_TRACE(strsignal(signal_number));
    xagg::Process training(
        {.argv = {XAGG_BINARY, "train", "--backend", "xagg", "--workers", "2", "--epochs", "20", "--prefix", kPrefix},
         .netns = std::nullopt,
         .output_file = std::nullopt});
    // Interrupted while its ranks train: once the last rank's namespace exists, and a little later.
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (!namespaces_left() && !training.poll() && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::seconds(3));
    ASSERT_FALSE(training.poll()) << "the run ended before it was interrupted:\n" << training.output();
    ::kill(training.pid(), signal_number);
    xagg::ProcessResult result = training.wait(Clock::now() + std::chrono::seconds(30));
    EXPECT_FALSE(result.timed_out) << result.output;
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("interrupted by"), std::string::npos) << result.output;
    EXPECT_FALSE(namespaces_left()) << xagg::run_command({"ip", "netns", "list"});
  }
}

}  // namespace
