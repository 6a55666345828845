// `xagg stats`: the data-plane counters of a running aggregator, read from
// the maps it pins, per job and in total.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <thread>

#include "commands.h"
#include "counters.h"
#include "link_stats.h"
#include "netns.h"

namespace xagg::tools {
namespace {

using dataplane::CounterRow;
using dataplane::CounterSnapshot;

nlohmann::json to_json(const CounterRow& row) {
  nlohmann::json object;
  for (int counter = 0; counter < XAGG_CNT_COUNT; counter++)
    object[std::string(dataplane::counter_name(static_cast<xagg_counter>(counter)))] = row[counter];
  return object;
}

void print_json(const CounterSnapshot& snapshot, const std::string& interface, const dataplane::LinkCounters& link) {
  nlohmann::json jobs = nlohmann::json::array();
  for (const auto& job : snapshot.jobs)
    jobs.push_back({{"job", job.job_id}, {"slot", job.slot}, {"counters", to_json(job.counters)}});
  nlohmann::json counters = nlohmann::json::object();
  for (const auto& [name, value] : link) counters[name] = value;
  nlohmann::json document{{"jobs", jobs},
                          {"no_job", to_json(snapshot.no_job)},
                          {"total", to_json(snapshot.total())},
                          {"interface", {{"name", interface}, {"counters", counters}}}};
  fmt::print("{}\n", document.dump());
}

// One column per job, then the job-less row and the total; one line per counter.
// Then the interface's own counters: frames dropped before XDP ran show only there.
void print_table(const CounterSnapshot& snapshot, const std::string& interface, const dataplane::LinkCounters& link) {
  std::vector<std::pair<std::string, const CounterRow*>> columns;
  for (const auto& job : snapshot.jobs) columns.emplace_back(fmt::format("job {}/{}", job.job_id, job.slot), &job.counters);
  columns.emplace_back("no job", &snapshot.no_job);
  CounterRow total = snapshot.total();
  columns.emplace_back("total", &total);

  fmt::print("{:<16}", "counter (job/slot)");
  for (const auto& [title, row] : columns) fmt::print(" {:>16}", title);
  fmt::print("\n");
  for (int counter = 0; counter < XAGG_CNT_COUNT; counter++) {
    fmt::print("{:<16}", dataplane::counter_name(static_cast<xagg_counter>(counter)));
    for (const auto& [title, row] : columns) fmt::print(" {:>16}", (*row)[counter]);
    fmt::print("\n");
  }
  fmt::print("\n{:<16} {:>16}\n", "interface", interface);
  for (const auto& [name, value] : link) fmt::print("{:<16} {:>16}\n", name, value);
  std::fflush(stdout);
}

}  // namespace

void add_stats_command(CLI::App& app) {
  auto* command = app.add_subcommand("stats", "Show the data-plane counters of a running aggregator and its interface's kernel counters");
  auto interface = std::make_shared<std::string>();
  auto netns = std::make_shared<std::string>();
  auto interval = std::make_shared<double>(1.0);
  auto count = std::make_shared<unsigned>(0);
  auto json = std::make_shared<bool>(false);
  command->add_option("--interface,-i", *interface, "Interface the aggregator runs on")->required();
  command->add_option("--netns", *netns, "Network namespace of the aggregator (entered with setns)");
  command->add_option("--interval", *interval, "Seconds between refreshes")->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--count", *count, "Print this many times, then exit (0: until interrupted)");
  command->add_flag("--json", *json, "One JSON object per refresh");
  command->callback([=] {
    if (!netns->empty()) enter_netns(*netns);  // pins live in the namespace's own /sys/fs/bpf view
    dataplane::PinnedCounters counters(*interface);
    for (unsigned printed = 0; *count == 0 || printed < *count; printed++) {
      if (printed > 0) std::this_thread::sleep_for(std::chrono::duration<double>(*interval));
      CounterSnapshot snapshot = counters.read();
      const dataplane::LinkCounters link = dataplane::read_link_counters(*interface);
      if (*json) {
        print_json(snapshot, *interface, link);
      } else {
        if (printed > 0) fmt::print("\n");
        print_table(snapshot, *interface, link);
      }
    }
  });
}

}  // namespace xagg::tools
