// How the `xagg` command writes its log: spdlog's text lines, or one JSON
// object per line for a log collector (--log-format, XAGG_LOG_FORMAT).
#pragma once

#include <spdlog/formatter.h>

#include <CLI/CLI.hpp>
#include <memory>

namespace xagg::tools {

// {"time":"2026-12-05T20:58:06.123456Z","level":"warning","component":"aggregator","pid":42,"thread":42,
//  "message":"..."}: the time in UTC with microseconds (RFC 3339), the component is the logger's name.
// The message is escaped by nlohmann::json (quotes, newlines, control characters); bytes that are
// not UTF-8, such as a peer's, become U+FFFD instead of failing the line.
class JsonLogFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& message, spdlog::memory_buf_t& dest) override;
  std::unique_ptr<spdlog::formatter> clone() const override;
};

// --log-level and --log-format (env XAGG_LOG_FORMAT) on the main app, applied
// once the command line is parsed, before any subcommand runs. json: every
// logger, also those made later, writes JSON lines to stderr, named after the
// subcommand. text: spdlog's default logger, unchanged.
void add_logging_options(CLI::App& app);

// For subcommands whose stdout is a report (doctor): log lines go to stderr.
void log_to_stderr();

}  // namespace xagg::tools
