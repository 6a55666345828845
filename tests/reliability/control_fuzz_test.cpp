// CI-sized run of the control-plane fuzz harness (the libFuzzer target runs
// the same harness for longer): seeded valid, malformed, oversized and
// out-of-order control lines over several connections.
// XAGG_CONTROL_FUZZ_CASES sets the number of inputs (default 20000).
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

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
      case 3: return control::encode(control::JoinReply{1, 9987, 20000, "198.18.255.255", 3});  // wrong direction
      default: {
        uint64_t elements = pick(3) == 0 ? uint64_t{1} << pick(40) : pick(5000);  // up to far beyond the quota
        return control::encode(control::JoinRequest{pick(3), pick(5), pick(4) + 1, elements});
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

// The same harness on hand-written sequences whose outcome is known.
TEST(ControlPlaneFuzz, KnownSequencesHoldTheInvariants) {
  spdlog::set_level(spdlog::level::off);
  auto join = [](char connection, uint32_t job, uint32_t rank, uint32_t world, uint64_t elements) {
    return std::string(1, connection) + control::encode(control::JoinRequest{job, rank, world, elements}) + "\n";
  };
  std::string leave = control::encode(control::Leave{});
  for (const std::string& input : {
           join(0, 1, 0, 2, 100) + join(1, 1, 1, 2, 100) + "\x80\n",              // a member crashes
           join(0, 1, 0, 2, 100) + join(1, 1, 0, 2, 100),                          // rank taken
           join(0, 1, 0, 1, uint64_t{1} << 40),                                    // over the quota
           std::string(1, 0) + leave + "\n" + join(0, 1, 0, 1, 5),                 // leave before join
           join(0, 1, 0, 1, 5) + join(0, 2, 0, 1, 5),                              // second join on one connection
           std::string(1, 2) + std::string(control::kMaxLineBytes + 10, '{') + "\n",  // oversized
       }) {
    EXPECT_EQ(run_control_input(input), std::vector<std::string>{}) << input;
  }
  spdlog::set_level(spdlog::level::info);
}

}  // namespace
}  // namespace xagg::reliability
