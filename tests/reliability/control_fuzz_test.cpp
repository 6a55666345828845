// CI-sized run of the control-plane fuzz harness (the libFuzzer target runs
// the same harness for longer): seeded valid, malformed, oversized and
// out-of-order control lines over several connections.
// XAGG_CONTROL_FUZZ_CASES sets the number of inputs (default 20000).
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <random>

#include "control_fuzz_harness.h"
#include "control_messages.h"

namespace xagg::reliability {
namespace {

class ControlInputGenerator {
 public:
  explicit ControlInputGenerator(uint64_t seed) : random_(seed) {}

  std::string next() {
    std::string input;
    for (uint32_t lines = pick(24) + 1; lines > 0; --lines) {
      auto connection = static_cast<char>(pick(kConnections));
      if (pick(12) == 0) {
        input += static_cast<char>(0x80 | connection);  // hang-up
      } else {
        input += connection;
        input += line();
      }
      input += '\n';
    }
    return input;
  }

 private:
  uint32_t pick(uint32_t bound) { return std::uniform_int_distribution<uint32_t>(0, bound - 1)(random_); }

  // A few jobs and ranks so that joins collide, complete and conflict.
  std::string valid_message() {
    switch (pick(6)) {
      case 0: return control::encode(control::Leave{});
      case 1: return control::encode(control::Error{"worker gave up"});
      case 2: return control::encode(control::Start{});                                     // wrong direction
      case 3: return control::encode(control::JoinReply{1, 9987, 20000, "198.18.255.255"});  // wrong direction
      default: {
        uint64_t elements = pick(3) == 0 ? uint64_t{1} << pick(40) : pick(5000);  // up to far beyond the quota
        return control::encode(control::JoinRequest{pick(3), pick(5), pick(4) + 1, elements, pick(4) == 0 ? pick(2000) : 9000});
      }
    }
  }

  std::string line() {
    std::string text = valid_message();
    switch (pick(8)) {
      case 0: return std::string(control::kMaxLineBytes + 1 + pick(100), 'x');  // oversized
      case 1: {  // random bytes
        std::string junk(pick(64), '\0');
        for (auto& c : junk) c = static_cast<char>(random_() % 255 + 1 == 10 ? 32 : random_() % 255 + 1);
        return junk;
      }
      case 2:  // a field value replaced
        for (std::string_view value : {"-1", "1e99", "4294967296", "null", "\"7\"", "[]", "{}", "18446744073709551616"}) {
          size_t colon = text.find(':', pick(static_cast<uint32_t>(text.size())));
          if (colon != std::string::npos && pick(3) == 0) {
            size_t end = text.find_first_of(",}", colon);
            text.replace(colon + 1, end - colon - 1, value);
          }
        }
        return text;
      case 3:  // truncated
        return text.substr(0, pick(static_cast<uint32_t>(text.size())));
      case 4:  // bytes flipped
        for (uint32_t flips = pick(4) + 1; flips > 0; --flips) {
          char& c = text[pick(static_cast<uint32_t>(text.size()))];
          c = static_cast<char>(c ^ (1 << pick(7)));
          if (c == '\n') c = ' ';
        }
        return text;
      default:
        return text;
    }
  }

  std::mt19937_64 random_;
};

TEST(ControlPlaneFuzz, MalformedOversizedAndOutOfOrderLinesAreRefusedWithoutHarm) {
  const char* configured = std::getenv("XAGG_CONTROL_FUZZ_CASES");
  const uint64_t cases = configured ? std::strtoull(configured, nullptr, 0) : 20000;
  spdlog::set_level(spdlog::level::off);
  ControlInputGenerator generator(0x58414767);
  uint64_t failing = 0;
  for (uint64_t i = 0; i < cases && failing < 5; ++i) {
    std::string input = generator.next();
    auto violations = run_control_input(input);
    if (violations.empty()) continue;
    ++failing;
    ADD_FAILURE() << fmt::format("input {}: {}\n{}", i, fmt::join(violations, "; "), input.substr(0, 2000));
  }
  spdlog::set_level(spdlog::level::info);
  std::cout << cases << " control-plane inputs\n";
}

// The same harness on hand-written sequences whose outcome is known: no
// invariant breaks, and exactly the expected error lines are sent.
TEST(ControlPlaneFuzz, KnownSequencesHoldTheInvariantsAndAreRefusedAsExpected) {
  spdlog::set_level(spdlog::level::off);
  auto join = [](char connection, uint32_t job, uint32_t rank, uint32_t world, uint64_t elements) {
    return std::string(1, connection) + control::encode(control::JoinRequest{job, rank, world, elements, 9000}) + "\n";
  };
  std::string leave = control::encode(control::Leave{});
  struct Known {
    const char* name;
    std::string input;
    std::vector<std::string> error_prefixes;  // of the error lines, "<connection>: <text>", in order
  };
  const Known known[] = {
      {"a member crashes", join(0, 1, 0, 2, 100) + join(1, 1, 1, 2, 100) + "\x80\n",
       {"1: job 1: rank 0 disconnected"}},
      {"rank taken", join(0, 1, 0, 2, 100) + join(1, 1, 0, 2, 100), {"1: job 1: rank 0 has joined already"}},
      {"over the quota", join(0, 1, 0, 1, uint64_t{1} << 40), {"0: job 1 needs "}},
      // The join comes after the daemon hung up: nobody reads it.
      {"leave before join", std::string(1, 0) + leave + "\n" + join(0, 1, 0, 1, 5), {"0: leave without a job joined"}},
      {"second join on one connection", join(0, 1, 0, 1, 5) + join(0, 2, 0, 1, 5),
       {"0: this connection has joined a job already"}},
      {"oversized", std::string(1, 2) + std::string(control::kMaxLineBytes + 10, '{') + "\n", {"2: refused"}},
  };
  for (const Known& sequence : known) {
    SCOPED_TRACE(sequence.name);
    ControlRun run = run_control(sequence.input);
    EXPECT_EQ(run.violations, std::vector<std::string>{});
    EXPECT_EQ(run.errors.size(), sequence.error_prefixes.size()) << fmt::format("{}", fmt::join(run.errors, "\n"));
    for (size_t i = 0; i < std::min(run.errors.size(), sequence.error_prefixes.size()); ++i)
      EXPECT_TRUE(run.errors[i].starts_with(sequence.error_prefixes[i])) << run.errors[i];
  }
  spdlog::set_level(spdlog::level::info);
}

}  // namespace
}  // namespace xagg::reliability
