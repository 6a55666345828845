#include "log_format.h"

#include <fmt/chrono.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>

namespace xagg::tools {
namespace {

std::string rfc3339_utc(std::chrono::system_clock::time_point time) {
  using namespace std::chrono;
  const auto since_epoch = duration_cast<microseconds>(time.time_since_epoch());
  const auto whole = floor<seconds>(since_epoch);
  const std::time_t seconds_since_epoch = whole.count();
  std::tm utc{};
  gmtime_r(&seconds_since_epoch, &utc);
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:06}Z", utc, (since_epoch - whole).count());
}

std::string text_of(spdlog::string_view_t view) { return std::string(view.data(), view.size()); }

bool json_logs = false;

}  // namespace

void JsonLogFormatter::format(const spdlog::details::log_msg& message, spdlog::memory_buf_t& dest) {
  // ordered_json: the keys in this order, time first, as collectors show them.
  const nlohmann::ordered_json line{
      {"time", rfc3339_utc(message.time)},
      {"level", text_of(spdlog::level::to_string_view(message.level))},
      {"component", text_of(message.logger_name)},
      {"pid", getpid()},
      {"thread", message.thread_id},
      {"message", text_of(message.payload)},
  };
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  dest.append(text.data(), text.data() + text.size());
  dest.push_back('\n');
}

std::unique_ptr<spdlog::formatter> JsonLogFormatter::clone() const { return std::make_unique<JsonLogFormatter>(); }

void add_logging_options(CLI::App& app) {
  auto level = std::make_shared<std::string>("info");
  auto format = std::make_shared<std::string>("text");
  app.add_option("--log-level", *level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  app.add_option("--log-format", *format, "text, or json: one JSON object per line on stderr")
      ->envname("XAGG_LOG_FORMAT")
      ->check(CLI::Validator(
          [](std::string& value) {
            return value == "text" || value == "json"
                       ? std::string()
                       : fmt::format("unknown log format '{}': use text or json", value);
          },
          "text|json"));
  app.parse_complete_callback([&app, level, format] {
    if (*format == "json") {
      json_logs = true;
      const std::vector<CLI::App*> commands = app.get_subcommands();
      const std::string component = commands.empty() ? std::string("xagg") : commands.front()->get_name();
      spdlog::set_default_logger(
          std::make_shared<spdlog::logger>(component, std::make_shared<spdlog::sinks::stderr_sink_mt>()));
      spdlog::set_formatter(std::make_unique<JsonLogFormatter>());  // also for loggers made later
    }
    spdlog::set_level(spdlog::level::from_str(*level));
  });
}

void log_to_stderr() {
  if (json_logs) return;  // there already
  auto logger = spdlog::default_logger();
  logger->sinks().assign({std::make_shared<spdlog::sinks::stderr_color_sink_mt>()});
}

}  // namespace xagg::tools
