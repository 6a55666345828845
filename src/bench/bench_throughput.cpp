// `xagg bench throughput`: XAgg (XDP engine), the same daemon with its
// user-space UDP engine, the TCP parameter server (sharded like XAgg), the
// switch-style baseline and Gloo's ring all-reduce over TCP (XAgg and Gloo
// also with 16 bits per element on the wire), back to back per
// size in one testbed per aggregator layout, with verified results, the
// aggregators' CPU cost (Gloo has none) and the link bound beside each.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <linux/bpf.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string_view>

#include "bench.h"
#include "cluster.h"
#include "link_bound.h"
#include "output_file.h"
#include "scenario.h"
#include "shaping.h"
#include "unique_fd.h"

namespace xagg::bench {
namespace {

using plan::link_demands;
using plan::link_seconds;
using plan::aggregation_of;

using testbed::AggregatorKind;

struct ThroughputOptions {
  uint32_t workers = 4;
  std::vector<std::string> sizes{"1M", "4M", "16M", "64M", "256M"};
  std::vector<std::string> layouts{"1"};  // testbed::Layout::parse, one testbed after another
  std::vector<uint32_t> mtus{testbed::kLinkMtu};  // for each layout, one testbed after another
  std::string results = "auto";  // the XAgg daemons' --results
  std::vector<std::string> systems{"xagg-xdp", "tcp-ps", "udp-user", "gloo"};
  uint32_t wire_bits = 32;  // 16: each of `systems` that has a 16-bit variant runs it (systems_at_wire_bits)
  double link_gbit = 0;  // every worker and aggregator link, both directions; 0: unshaped
  std::vector<std::string> competing_flow;  // empty, or the two hosts of a bulk TCP flow ("worker 1", "aggregator 0")
  uint32_t iterations = 5;
  std::string json_file;
  std::string prefix = testbed::per_run_prefix("xbench");
  uint32_t timeout_s = 600;  // per system and size
};

constexpr BenchSystem kSystems[] = {{"xagg-xdp", AggregatorKind::Xdp},
                                    {"xagg-xdp16", AggregatorKind::Xdp, 16},
                                    {"tcp-ps", AggregatorKind::TcpPs},
                                    {"udp-user", AggregatorKind::Userspace},
                                    {"udp-user16", AggregatorKind::Userspace, 16},
                                    {"switch", AggregatorKind::Switch},
                                    {"switch-jumbo", AggregatorKind::SwitchJumbo},
                                    {"gloo", AggregatorKind::Gloo},
                                    {"gloo16", AggregatorKind::Gloo, 16}};

// Bytes through the aggregators' links, from the kernel's counters of their
// bridge ports (frames that crossed, whatever sent them: XDP_TX included).
struct LinkBytes {
  uint64_t to_aggregators = 0;
  uint64_t from_aggregators = 0;
};

LinkBytes aggregator_link_bytes(const testbed::Testbed& bed) {
  LinkBytes bytes;
  for (uint32_t k = 0; k < bed.aggregator_count(); ++k) {
    const testbed::HostLink link = bed.aggregator(k);
    auto stats = nlohmann::json::parse(run_command(
                     {"ip", "-n", link.bridge_netns, "-s", "-j", "link", "show", "dev", link.bridge_port}))
                     .at(0)
                     .at("stats64");
    bytes.to_aggregators += stats.at("tx").at("bytes").get<uint64_t>();
    bytes.from_aggregators += stats.at("rx").at("bytes").get<uint64_t>();
  }
  return bytes;
}

// The seconds the shaped links need for one all-reduce of `bytes` of float32
// by this system in this layout (the switch baseline runs on the first
// aggregator host only; a 16-bit system moves half the bytes); 0 without shaping.
double link_seconds_for(const ThroughputOptions& options, const testbed::Layout& layout, const BenchSystem& system,
                        uint64_t bytes) {
  const std::vector<double> workers(options.workers, options.link_gbit);
  const std::vector<double> aggregators(layout.colocated ? 0 : layout.aggregators, options.link_gbit);
  return link_seconds(link_demands(layout, options.workers, workers, aggregators, aggregation_of(system.kind, layout),
                                   double(bytes) * system.wire_bits / 32));
}

uint64_t parse_size(const std::string& text) {
  size_t digits = 0;
  uint64_t value = std::stoull(text, &digits);
  std::string suffix = text.substr(digits);
  if (suffix == "K") return value << 10;
  if (suffix == "M") return value << 20;
  if (suffix == "G") return value << 30;
  if (suffix.empty()) return value;
  throw std::invalid_argument(fmt::format("size '{}': use bytes with an optional K, M or G suffix", text));
}

long bpf_syscall(bpf_cmd command, bpf_attr& attr) { return syscall(__NR_bpf, command, &attr, sizeof(attr)); }

// Per-program run-time accounting (kernel.bpf_stats_enabled) for as long as
// this object lives; the kernel turns it off again when the fd closes, also
// if this process dies.
class BpfRunTimeStats {
 public:
  BpfRunTimeStats() {
    bpf_attr attr{};
    attr.enable_stats.type = BPF_STATS_RUN_TIME;
    fd_ = UniqueFd(static_cast<int>(bpf_syscall(BPF_ENABLE_STATS, attr)));
    if (!fd_) throw std::runtime_error(fmt::format("enabling BPF run-time statistics: {}", std::strerror(errno)));
  }

 private:
  UniqueFd fd_;
};

// Total run time of the XDP program attached to one aggregator's interface.
std::chrono::nanoseconds xdp_run_time(const testbed::HostLink& aggregator) {
  std::string links = xagg::run_command(
      {"ip", "-n", aggregator.netns, "-d", "-j", "link", "show", "dev", aggregator.interface});
  auto program = nlohmann::json::parse(links).at(0).at("xdp").at("prog");
  bpf_attr attr{};
  attr.prog_id = program.at("id").get<uint32_t>();
  UniqueFd fd(static_cast<int>(bpf_syscall(BPF_PROG_GET_FD_BY_ID, attr)));
  if (!fd) throw std::runtime_error(fmt::format("opening XDP program {}: {}", attr.prog_id, std::strerror(errno)));
  bpf_prog_info info{};
  attr = {};
  attr.info.bpf_fd = static_cast<uint32_t>(fd.get());
  attr.info.info_len = sizeof(info);
  attr.info.info = reinterpret_cast<uint64_t>(&info);
  if (bpf_syscall(BPF_OBJ_GET_INFO_BY_FD, attr) != 0)
    throw std::runtime_error(fmt::format("reading XDP program info: {}", std::strerror(errno)));
  return std::chrono::nanoseconds(info.run_time_ns);
}

// User plus system CPU time of a process, all its threads (/proc/<pid>/stat fields 14 and 15).
double cpu_seconds(pid_t pid) {
  std::ifstream file(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(file)), {});
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // the command name may hold spaces
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int index = 3; fields >> field; ++index) {
    if (index == 14) utime = std::stoull(field);
    if (index == 15) {
      stime = std::stoull(field);
      break;
    }
  }
  return double(utime + stime) / double(sysconf(_SC_CLK_TCK));
}

// Over every aggregator of the testbed.
std::chrono::nanoseconds xdp_run_time(const testbed::Testbed& bed) {
  std::chrono::nanoseconds total{0};
  for (uint32_t k = 0; k < bed.aggregator_count(); ++k) total += xdp_run_time(bed.aggregator(k));
  return total;
}

double cpu_seconds(const std::vector<pid_t>& pids) {
  double total = 0;
  for (pid_t pid : pids) total += cpu_seconds(pid);
  return total;
}

// One testbed of the run: an aggregator layout at one link MTU.
struct Setup {
  testbed::Layout layout;
  uint32_t mtu = testbed::kLinkMtu;
  std::string label() const { return fmt::format("aggregators {}, MTU {}", layout.to_string(), mtu); }
};

struct Measurement {
  std::string setup;  // Setup::label()
  uint32_t mtu = 0;
  std::string system;
  uint64_t bytes = 0;
  double link_seconds = 0;  // what the shaped links need at least; 0 unshaped
  // Mean over timed iterations of the slowest rank's time; none when a rank
  // reported no time for one of them (failed): the slowest would be unknown.
  std::optional<double> seconds{};
  uint64_t wrong = 0;  // wrong elements, plus one per failed worker
  struct AggregatorCpu {
    double process_s = 0;
    double bpf_s = 0;
  };
  std::optional<AggregatorCpu> cpu{};  // none for Gloo: its ranks reduce among themselves
  std::optional<double> flow_gbit{};   // the competing flow's goodput meanwhile, if there is one
  // Bytes on the aggregators' links per element all-reduced (every iteration,
  // warm-up included), each way; none without an aggregator.
  std::optional<double> up_bytes_per_element{}, down_bytes_per_element{};
  xagg::Clock::time_point workers_start{}, workers_end{};  // the ranks' run, warm-up included

  std::optional<double> algbw() const {
    if (!seconds || *seconds <= 0) return std::nullopt;
    return double(bytes) / *seconds;
  }
  std::optional<double> bound_algbw() const {
    if (link_seconds <= 0) return std::nullopt;
    return double(bytes) / link_seconds;
  }
  std::optional<double> busbw(uint32_t workers) const {
    if (!algbw()) return std::nullopt;
    return *algbw() * 2.0 * (workers - 1) / workers;
  }
  // None also for a failed run: it did not move bytes x iterations.
  std::optional<double> cpu_per_gb(uint32_t iterations) const {
    if (!cpu || !seconds) return std::nullopt;
    return (cpu->process_s + cpu->bpf_s) / (double(bytes) * iterations / 1e9);
  }
};

std::optional<double> scaled(std::optional<double> value, double factor) {
  if (!value) return std::nullopt;
  return *value * factor;
}

std::optional<double> ratio(std::optional<double> numerator, std::optional<double> denominator) {
  if (!numerator || !denominator || *denominator <= 0) return std::nullopt;
  return *numerator / *denominator;
}

// `missing` where a figure does not exist: "n/a" (no aggregator, no reference) or "failed".
std::string format_or(std::optional<double> value, int width, int precision, std::string_view missing) {
  return value ? fmt::format("{:>{}.{}f}", *value, width, precision) : fmt::format("{:>{}}", missing, width);
}

nlohmann::json or_null(std::optional<double> value) { return value ? nlohmann::json(*value) : nlohmann::json(); }

Measurement measure(const ThroughputOptions& options, testbed::Cluster& cluster, const testbed::Testbed& bed,
                    const Setup& setup, const BenchSystem& system, uint64_t bytes) {
  using xagg::Clock;
  cluster.start_aggregator(Clock::now() + std::chrono::seconds(30), system.kind);
  std::optional<BpfRunTimeStats> stats;
  if (system.kind == AggregatorKind::Xdp) stats.emplace();
  auto bpf_before = system.kind == AggregatorKind::Xdp ? xdp_run_time(bed) : std::chrono::nanoseconds{0};
  const std::vector<pid_t> aggregators = cluster.aggregator_pids();
  double cpu_before = cpu_seconds(aggregators);
  const LinkBytes link_before = aggregator_link_bytes(bed);

  testbed::JobSpec job;
  job.workers = options.workers;
  job.elements = bytes / sizeof(float);
  job.iterations = options.iterations;
  job.wire_bits = system.wire_bits;
  const Clock::time_point workers_start = Clock::now();
  auto results = cluster.run_workers(job, Clock::now() + std::chrono::seconds(options.timeout_s));

  Measurement measurement{setup.label(), setup.mtu, system.name, bytes,
                          link_seconds_for(options, setup.layout, system, bytes)};
  measurement.workers_start = workers_start;
  measurement.workers_end = Clock::now();
  if (!aggregators.empty()) {
    measurement.cpu = Measurement::AggregatorCpu{cpu_seconds(aggregators) - cpu_before};
    const LinkBytes link_after = aggregator_link_bytes(bed);
    const double elements = double(job.elements) * options.iterations;
    measurement.up_bytes_per_element = double(link_after.to_aggregators - link_before.to_aggregators) / elements;
    measurement.down_bytes_per_element = double(link_after.from_aggregators - link_before.from_aggregators) / elements;
  }
  if (system.kind == AggregatorKind::Xdp)
    measurement.cpu->bpf_s = std::chrono::duration<double>(xdp_run_time(bed) - bpf_before).count();
  stats.reset();
  auto server = cluster.stop_aggregator();

  // Iteration 0 warms up (first touch of buffers and cells) unless it is the only one.
  uint32_t first_timed = options.iterations > 1 ? 1 : 0;
  std::vector<double> slowest(options.iterations, 0.0);
  std::vector<size_t> reported(options.iterations, 0);  // ranks with a time for the iteration
  for (const auto& result : results) {
    if (result.exit_code != 0 || result.timed_out) {
      ++measurement.wrong;
      spdlog::error("{} {} bytes: worker failed:\n{}\nserver:\n{}", system.name, bytes, result.output, server.output);
    }
    auto reports = testbed::worker_reports(result.output);
    for (const auto& report : reports) {
      uint32_t iteration = report.at("iteration").get<uint32_t>();
      measurement.wrong += report.at("wrong").get<uint64_t>();
      if (iteration < slowest.size()) {
        slowest[iteration] = std::max(slowest[iteration], report.at("seconds").get<double>());
        ++reported[iteration];
      }
    }
  }
  double total = 0;
  for (uint32_t iteration = first_timed; iteration < options.iterations; ++iteration) {
    if (reported[iteration] < options.workers) {
      spdlog::error("{} {} bytes: {} of {} ranks reported iteration {}: no time", system.name, bytes,
                    reported[iteration], options.workers, iteration);
      return measurement;
    }
    total += slowest[iteration];
  }
  measurement.seconds = total / (options.iterations - first_timed);
  return measurement;
}

// null where a figure does not exist (no aggregator, failed run).
void write_json(const ThroughputOptions& options, const std::vector<Measurement>& measurements, std::ofstream& file) {
  nlohmann::json results = nlohmann::json::array();
  const nlohmann::json none;  // no aggregator
  for (const auto& m : measurements)
    results.push_back({{"setup", m.setup},
                       {"mtu", m.mtu},
                       {"system", m.system},
                       {"bytes", m.bytes},
                       {"link_bound_seconds", m.link_seconds > 0 ? nlohmann::json(m.link_seconds) : none},
                       {"seconds", or_null(m.seconds)},
                       {"algbw_bytes_per_s", or_null(m.algbw())},
                       {"busbw_bytes_per_s", or_null(m.busbw(options.workers))},
                       {"wrong", m.wrong},
                       {"aggregator_process_cpu_s", m.cpu ? nlohmann::json(m.cpu->process_s) : none},
                       {"aggregator_bpf_cpu_s", m.cpu ? nlohmann::json(m.cpu->bpf_s) : none},
                       {"aggregator_cpu_s_per_gb", or_null(m.cpu_per_gb(options.iterations))},
                       {"competing_flow_gbit", or_null(m.flow_gbit)},
                       {"aggregator_link_up_bytes_per_element", or_null(m.up_bytes_per_element)},
                       {"aggregator_link_down_bytes_per_element", or_null(m.down_bytes_per_element)}});
  nlohmann::json document{{"workers", options.workers},
                          {"iterations", options.iterations},
                          {"link_gbit", options.link_gbit},
                          {"competing_flow", options.competing_flow},
                          {"result_mode", options.results},
                          {"results", results}};
  file << document.dump(2) << "\n";
  close_output(file, options.json_file);  // complete before the plot reads it
  auto png = std::filesystem::path(options.json_file).replace_extension(".png");
  auto script = find_script("plot_throughput.py");
  if (!script) return spdlog::warn("scripts/plot_throughput.py not found; no plot");
  try {
    xagg::run_command({"/usr/bin/python3", script->string(), options.json_file, png.string()});
    fmt::print("wrote {} and {}\n", options.json_file, png.string());
  } catch (const xagg::CommandError& error) {
    spdlog::warn("plotting failed: {}", error.what());
  }
}

// algbw and aggregator CPU of every system and size in each setup, algbw relative to the first setup's.
void print_setup_summary(const ThroughputOptions& options, const std::vector<const BenchSystem*>& systems,
                         const std::vector<Setup>& setups, const std::vector<Measurement>& measurements) {
  fmt::print("\n# algbw (GB/s) and aggregator CPU (s/GB) by setup; in parentheses, algbw relative to {}\n",
             setups.front().label());
  for (const Setup& setup : setups) fmt::print("#   setup {}: {}\n", &setup - setups.data(), setup.label());
  fmt::print("{:>12} {:>12}", "size(B)", "system");
  for (size_t index = 0; index < setups.size(); ++index) fmt::print(" {:>26}", fmt::format("setup {}", index));
  fmt::print("\n");
  auto find = [&](const Setup& setup, const std::string& system, uint64_t bytes) -> const Measurement* {
    for (const Measurement& m : measurements)
      if (m.setup == setup.label() && m.system == system && m.bytes == bytes) return &m;
    return nullptr;
  };
  for (const std::string& size : options.sizes) {
    const uint64_t bytes = parse_size(size) / sizeof(float) * sizeof(float);
    for (const BenchSystem* system : systems) {
      const Measurement* first = find(setups.front(), system->name, bytes);
      fmt::print("{:>12} {:>12}", bytes, system->name);
      for (const Setup& setup : setups) {
        const Measurement* m = find(setup, system->name, bytes);
        std::optional<double> algbw = m ? m->algbw() : std::nullopt;
        std::optional<double> cpu = m ? m->cpu_per_gb(options.iterations) : std::nullopt;
        fmt::print(" {:>26}", algbw ? fmt::format("{:.3f} ({:.2f}x) {}", *algbw * 1e-9,
                                                  ratio(algbw, first ? first->algbw() : std::nullopt).value_or(0),
                                                  cpu ? fmt::format("{:.3f}", *cpu) : "n/a")
                                    : "failed");
      }
      fmt::print("\n");
    }
  }
}

int run_throughput(const ThroughputOptions& options) {
  std::ofstream json_file;
  if (!options.json_file.empty()) json_file = open_output(options.json_file);
  std::vector<const BenchSystem*> systems;
  for (const std::string& name : systems_at_wire_bits(kSystems, options.systems, options.wire_bits))
    systems.push_back(&system_named(kSystems, name));
  std::vector<Setup> setups;
  for (const std::string& layout : options.layouts)
    for (uint32_t mtu : options.mtus) setups.push_back({testbed::Layout::parse(layout), mtu});
  for (const Setup& setup : setups)
    if (setup.layout.two_level)
      (void)setup.layout.ranks_per_leaf(options.workers);  // throws when the workers do not fill the leaves
    else if (options.workers > XAGG_MAX_WORKERS)
      throw std::invalid_argument(fmt::format("--workers {}: one aggregator level takes at most {} ranks (layout {})",
                                              options.workers, XAGG_MAX_WORKERS, setup.layout.to_string()));
  testbed::Testbed bed(options.prefix);
  const xagg::InterruptGuard interrupts;  // Ctrl-C stops the workers and removes the testbed
  testbed::TeardownGuard teardown(bed);

  fmt::print("# all-reduce of float32, {} workers, {} iterations per size (first one untimed), every element verified\n",
             options.workers, options.iterations);
  fmt::print(
      "# ...16: 16 bits per element on the wire (XAgg's 16-bit wire, Gloo's float16); algbw/gloo is against\n"
      "# Gloo at the system's width (gloo16 for the 16-bit systems)\n");
  fmt::print("# aggregator CPU = daemon/server process CPU + XDP program run time (it runs in the senders' softirq),\n"
             "# summed over the layout's aggregators; gloo has no aggregator: its ranks run a ring all-reduce over TCP\n");
  if (options.link_gbit > 0)
    fmt::print("# every link (workers', aggregators', co-located hosts') shaped to {} Gbit/s both ways; bound = the\n"
               "# algbw the busiest link allows this system in this layout (docs/performance.md, scale-out)\n",
               options.link_gbit);
  std::optional<testbed::CompetingFlowSpec> competing;
  if (!options.competing_flow.empty()) {
    try {
      competing = {testbed::HostRef::parse(options.competing_flow.at(0)),
                   testbed::HostRef::parse(options.competing_flow.at(1))};
      for (const Setup& setup : setups) testbed::check_competing_flow(*competing, options.workers, setup.layout);
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument(fmt::format("--competing-flow: {}", error.what()));
    }
    fmt::print("# a competing bulk TCP flow {} runs through each layout's measurements; \"flow\" is its goodput "
               "while each system's ranks ran\n",
               competing->label());
  }
  std::vector<Measurement> measurements;
  uint64_t wrong = 0;
  bool failed = false;
  for (const Setup& setup : setups) {
    const testbed::Layout& layout = setup.layout;
    bed.up(options.workers, layout, setup.mtu);
    std::optional<testbed::Shaping> shaping;
    if (options.link_gbit > 0)
      shaping.emplace(bed, testbed::LinkRates{std::vector<double>(layout.colocated ? 0 : layout.aggregators,
                                                                  options.link_gbit),
                                              std::vector<double>(options.workers, options.link_gbit)});
    std::vector<std::unique_ptr<testbed::CompetingFlow>> flows;
    if (competing)
      flows.push_back(std::make_unique<testbed::CompetingFlow>(bed.host(competing->from), bed.host(competing->to),
                                                               competing->label()));
    testbed::Cluster cluster(std::filesystem::read_symlink("/proc/self/exe"), bed);
    cluster.set_result_mode(options.results);
    fmt::print("\n# {}, results {}\n", setup.label(), options.results);
    fmt::print("{:>12} {:>12} {:>12} {:>10} {:>10} {:>7} {:>11} {:>9} {:>9} {:>10} {:>9} {:>8}{}\n", "size(B)",
               "system", "time(us)", "algbw", "busbw", "#wrong", "aggCPU s/GB", "algbw/ps", "cpu/ps", "algbw/gloo",
               "bound", "%bound", competing ? fmt::format(" {:>9}", "flow") : "");
    fmt::print("{:>12} {:>12} {:>12} {:>10} {:>10} {:>7} {:>11} {:>9} {:>9} {:>10} {:>9} {:>8}{}\n", "", "", "",
               "(GB/s)", "(GB/s)", "", "", "", "", "", "(GB/s)", "", competing ? fmt::format(" {:>9}", "(Gbit/s)") : "");
    for (const auto& size : options.sizes) {
      uint64_t bytes = parse_size(size) / sizeof(float) * sizeof(float);
      std::map<std::string, Measurement> by_system;
      for (const BenchSystem* system : systems) {
        Measurement& m = by_system[system->name] = measure(options, cluster, bed, setup, *system, bytes);
        if (competing) m.flow_gbit = flows.front()->gbit_between(m.workers_start, m.workers_end);
      }
      auto reference = [&](const char* name) {
        auto found = by_system.find(name);
        return found == by_system.end() ? std::optional<Measurement>{} : found->second;
      };
      const std::optional<Measurement> ps = reference("tcp-ps");
      for (const BenchSystem* system : systems) {
        const Measurement& m = by_system.at(system->name);
        const std::optional<Measurement> gloo = reference(system->wire_bits == 16 ? "gloo16" : "gloo");
        const std::string_view missing = m.seconds ? "n/a" : "failed";
        std::optional<double> cpu = m.cpu_per_gb(options.iterations);
        fmt::print("{:>12} {:>12} {} {} {} {:>7} {} {} {} {} {} {}{}\n", bytes, m.system,
                   format_or(scaled(m.seconds, 1e6), 12, 0, missing),
                   format_or(scaled(m.algbw(), 1e-9), 10, 3, missing),
                   format_or(scaled(m.busbw(options.workers), 1e-9), 10, 3, missing), m.wrong,
                   format_or(cpu, 11, 3, missing),
                   format_or(ratio(m.algbw(), ps ? ps->algbw() : std::nullopt), 9, 2, missing),
                   format_or(ratio(cpu, ps ? ps->cpu_per_gb(options.iterations) : std::nullopt), 9, 3, missing),
                   format_or(ratio(m.algbw(), gloo ? gloo->algbw() : std::nullopt), 10, 2, missing),
                   format_or(scaled(m.bound_algbw(), 1e-9), 9, 3, "n/a"),
                   format_or(scaled(ratio(m.algbw(), m.bound_algbw()), 100), 8, 0, "n/a"),
                   competing ? " " + format_or(m.flow_gbit, 9, 3, "n/a") : "");
        std::fflush(stdout);
        wrong += m.wrong;
        failed = failed || !m.seconds;
        measurements.push_back(m);
      }
      // Bytes per element on the aggregators' links, beside the 32-bit wire's (xagg-xdp, udp-user).
      for (const BenchSystem* system : systems) {
        const Measurement& m = by_system.at(system->name);
        if (!m.up_bytes_per_element) continue;
        const std::optional<Measurement> wide =
            reference(system->kind == AggregatorKind::Userspace ? "udp-user" : "xagg-xdp");
        fmt::print("{:>12} {:>12} aggregator link bytes per element: up {:.3f} ({} of 32-bit), down {:.3f} ({} of "
                   "32-bit)\n",
                   bytes, m.system, *m.up_bytes_per_element,
                   format_or(ratio(m.up_bytes_per_element, wide ? wide->up_bytes_per_element : std::nullopt), 5, 3,
                             "n/a"),
                   *m.down_bytes_per_element,
                   format_or(ratio(m.down_bytes_per_element, wide ? wide->down_bytes_per_element : std::nullopt), 5,
                             3, "n/a"));
      }
    }
    for (const auto& flow : flows) {
      const testbed::FlowReport report = flow->stop();
      fmt::print("# competing flow {}: {:.2f} GB in {:.1f} s, {:.3f} Gbit/s{}\n", flow->label(),
                 double(report.bytes) / 1e9, report.seconds, report.gbit(),
                 report.error.empty() ? "" : " -- BROKE: " + report.error);
      failed = failed || !report.error.empty();
    }
  }
  if (setups.size() > 1) print_setup_summary(options, systems, setups, measurements);
  if (json_file.is_open()) write_json(options, measurements, json_file);
  return wrong == 0 && !failed ? 0 : 1;
}

}  // namespace

void add_throughput_command(CLI::App& bench) {
  auto options = std::make_shared<ThroughputOptions>();
  auto* command = bench.add_subcommand("throughput",
                                       "All-reduce throughput and aggregator CPU per aggregator layout: XAgg (XDP), "
                                       "its user-space UDP engine, the TCP PS, the switch baseline, Gloo's ring");
  command->add_option("--workers", options->workers, "Ranks (past 64 only on two-level layouts)")
      ->check(CLI::Range(2u, testbed::kMaxWorkers))
      ->capture_default_str();
  command->add_option("--aggregators", options->layouts,
                      "Aggregator layouts, one testbed after another: K dedicated aggregators (1..64), colocated "
                      "(one on every worker host), routed (workers on two subnets behind a router) or two-level:L "
                      "(XAgg in L leaves and a root; the baselines shard over all L+1), comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--results", options->results,
                      "How the XAgg daemons send RESULTs (their --results): auto, broadcast, multicast or unicast")
      ->check(CLI::IsMember({"auto", "broadcast", "multicast", "unicast"}))
      ->capture_default_str();
  command->add_option("--mtus", options->mtus,
                      "Link MTUs, each a testbed of its own for every layout (comma-separated): the job's chunk size "
                      "follows the smallest path MTU")
      ->delimiter(',')
      ->check(CLI::Range(testbed::kMinTestbedMtu, testbed::kMaxTestbedMtu))
      ->capture_default_str();
  command
      ->add_option("--systems", options->systems,
                   fmt::format("Systems to run, comma-separated: {} (...16: 16 bits per element on the wire, "
                               "XAgg's 16-bit wire or Gloo's float16)",
                               fmt::join(system_names(kSystems), ", ")))
      ->delimiter(',')
      ->check(CLI::IsMember(system_names(kSystems)))
      ->capture_default_str();
  command
      ->add_option("--wire-bits", options->wire_bits,
                   "Bits per element on the wire, 32 or 16: at 16 every listed system that has a 16-bit variant "
                   "runs it (xagg-xdp as xagg-xdp16, gloo as gloo16; tcp-ps and the switch stay 32-bit)")
      ->check(CLI::IsMember({32, 16}))
      ->capture_default_str();
  command->add_option("--link-gbit", options->link_gbit,
                      "Shape every link (workers', aggregators', co-located hosts') to this rate; 0: unshaped")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--competing-flow", options->competing_flow,
                      "A bulk TCP flow between two hosts for the whole run, e.g. --competing-flow \"worker 1\" "
                      "\"aggregator 0\" (docs/evaluation.md, competing_flows)")
      ->expected(2);
  command->add_option("--sizes", options->sizes, "Bytes per all-reduce (K/M/G suffixes)")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--iterations", options->iterations, "All-reduces per size and system")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--json", options->json_file, "Write the figures here, and a PNG plot beside it");
  command->add_option("--prefix", options->prefix, "Testbed namespace prefix")->capture_default_str();
  command->add_option("--timeout-s", options->timeout_s, "Deadline per system and size")->capture_default_str();
  command->callback([options] {
    if (run_throughput(*options) != 0) throw std::runtime_error("some results were wrong or workers failed");
  });
}

}  // namespace xagg::bench
