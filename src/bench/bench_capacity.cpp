// `xagg bench capacity`: the gradient payload one aggregator core sums per
// second when no sender limits it. The XDP program is fed jumbo DATA frames
// with BPF_PROG_RUN on 1 and 2 cores, the TCP parameter server is fed by client threads
// over loopback, and the machine's memory bandwidth for the same summing is
// measured beside them as the ceiling.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "baselines/tcp_ps/tcp_ps_client.h"
#include "bench.h"
#include "capacity_feed.h"
#include "output_file.h"
#include "capacity_feed.skel.h"
#include "dataplane.h"
#include "testbed.h"
#include "wire.h"

namespace xagg::bench {
namespace {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

constexpr uint32_t kJobId = 1;
constexpr uint64_t kToken = 0x0123456789abcdef;
constexpr uint16_t kWorkerPort = 20000;       // every rank sends from one address and port
// BPF_PROG_RUN calls are sized to last about this long, so that the deadline
// is kept without a system call per frame.
constexpr double kSecondsPerCall = 0.25;
constexpr uint32_t kFirstCallFrames = 1 << 16;
constexpr uint16_t kTcpPort = 9990;
constexpr size_t kChunkBytes = wire::kChunkElems * sizeof(int32_t);
static_assert(FEED_HEADER_BYTES == sizeof(ethhdr) + sizeof(iphdr) + sizeof(udphdr) + wire::kHeaderBytes);

struct CapacityOptions {
  double seconds = 3;
  std::vector<int> cpus{0, 1};
  uint32_t world_size = 4;
  uint32_t gradient_mib = 64;
  uint32_t tcp_mib = 4;
  uint32_t memory_mib = 1024;
  std::vector<std::string> systems{"xdp", "tcp-ps", "memory"};
  std::string netns = "xcap-bench";
  std::string json_file;

  bool runs(const std::string& system) const { return std::ranges::find(systems, system) != systems.end(); }
};

// One measured configuration. Payload: DATA payload bytes fed to XDP, float32
// bytes pushed to the PS, input bytes for the memory ceiling.
struct Rate {
  std::string system;
  std::string setup;
  size_t cores = 0;
  uint64_t payload_bytes = 0;
  double wall_s = 0;  // the longest of the measuring threads
  double cpu_s = 0;   // CPU time of the threads or process that did the summing
  nlohmann::json checks = nlohmann::json::object();

  double gbps() const { return wall_s > 0 ? payload_bytes * 8.0 / wall_s / 1e9 : 0; }
  double gbps_per_core() const { return cpu_s > 0 ? payload_bytes * 8.0 / cpu_s / 1e9 : 0; }
  double busy() const { return wall_s > 0 ? cpu_s / (wall_s * double(cores)) : 0; }
  double ns_per_chunk() const { return payload_bytes ? cpu_s * 1e9 / (double(payload_bytes) / kChunkBytes) : 0; }
};

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(Seconds(seconds));
}

double clock_seconds(clockid_t clock) {
  timespec now{};
  clock_gettime(clock, &now);
  return double(now.tv_sec) + double(now.tv_nsec) * 1e-9;
}

// Scheduler-exact CPU time of another process, all its threads.
clockid_t process_cpu_clock(pid_t pid) {
  clockid_t clock{};
  if (int rc = clock_getcpuclockid(pid, &clock); rc != 0)
    throw std::runtime_error(fmt::format("CPU clock of process {}: {}", pid, std::strerror(rc)));
  return clock;
}

void pin_to(std::span<const int> cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  if (int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set); rc != 0)
    throw std::runtime_error(fmt::format("pinning a thread to CPUs {}: {}", fmt::join(cpus, ","), std::strerror(rc)));
}

struct ThreadTimes {
  double wall_s = 0;
  double cpu_s = 0;
};

// Runs body(k) on one thread per CPU, each pinned to cpus[k], all started
// together; returns each thread's wall and CPU time and rethrows its failure.
std::vector<ThreadTimes> run_pinned(const std::vector<int>& cpus, const std::function<void(size_t)>& body) {
  std::vector<ThreadTimes> times(cpus.size());
  std::vector<std::exception_ptr> errors(cpus.size());
  std::barrier start(static_cast<ptrdiff_t>(cpus.size()));
  {
    std::vector<std::jthread> threads;
    for (size_t k = 0; k < cpus.size(); k++)
      threads.emplace_back([&, k] {
        bool started = false;
        try {
          pin_to(std::span(&cpus[k], 1));
          start.arrive_and_wait();
          started = true;
          double wall = clock_seconds(CLOCK_MONOTONIC), cpu = clock_seconds(CLOCK_THREAD_CPUTIME_ID);
          body(k);
          times[k] = {clock_seconds(CLOCK_MONOTONIC) - wall, clock_seconds(CLOCK_THREAD_CPUTIME_ID) - cpu};
        } catch (...) {
          errors[k] = std::current_exception();
          if (!started) start.arrive_and_drop();  // the others must not wait for this thread
        }
      });
  }
  for (auto& error : errors)
    if (error) std::rethrow_exception(error);
  return times;
}

Rate with_times(Rate rate, const std::vector<ThreadTimes>& times) {
  for (const auto& t : times) {
    rate.wall_s = std::max(rate.wall_s, t.wall_s);
    rate.cpu_s += t.cpu_s;
  }
  return rate;
}

// A network namespace for the TCP PS's loopback, deleted with everything in it
// when the object goes, also after a failure. A killed run's leftover is replaced.
class ScratchNetns {
 public:
  explicit ScratchNetns(std::string name) : name_(std::move(name)) {
    if (std::filesystem::exists("/run/netns/" + name_)) {
      spdlog::warn("removing network namespace {} left by an earlier run", name_);
      remove();
    }
    xagg::run_command({"ip", "netns", "add", name_});
    try {
      xagg::run_command({"ip", "-n", name_, "link", "set", "lo", "up"});
    } catch (...) {
      remove();
      throw;
    }
  }
  ~ScratchNetns() { remove(); }
  ScratchNetns(const ScratchNetns&) = delete;
  ScratchNetns& operator=(const ScratchNetns&) = delete;

  const std::string& name() const { return name_; }

 private:
  void remove() noexcept {
    try {
      xagg::run_command({"ip", "netns", "delete", name_});
    } catch (const std::exception& error) {
      spdlog::warn("removing network namespace {}: {}", name_, error.what());
    }
  }

  std::string name_;
};

// ---- XDP: BPF_PROG_RUN frames ----------------------------------------------

struct FeedDeleter {
  void operator()(capacity_feed_bpf* skeleton) const { capacity_feed_bpf__destroy(skeleton); }
};

const in_addr kWorkerIp{inet_addr("198.18.0.2")};
const in_addr kAggregatorIp{inet_addr("198.18.0.1")};
const in_addr kBroadcastIp{inet_addr("198.18.255.255")};

// The DATA frame every run gets; the feeder rewrites its headers per run.
std::vector<uint8_t> data_frame() {
  std::vector<uint8_t> frame(FEED_HEADER_BYTES + kChunkBytes);
  auto* eth = reinterpret_cast<ethhdr*>(frame.data());
  std::memcpy(eth->h_dest, "\x02\x00\x00\x00\x00\xaa", ETH_ALEN);
  std::memcpy(eth->h_source, "\x02\x00\x00\x00\x01\x00", ETH_ALEN);
  eth->h_proto = htons(ETH_P_IP);
  auto* ip = reinterpret_cast<iphdr*>(eth + 1);
  ip->version = 4;
  ip->ihl = 5;
  ip->tot_len = htons(static_cast<uint16_t>(frame.size() - sizeof(ethhdr)));
  ip->ttl = 64;
  ip->protocol = IPPROTO_UDP;
  ip->saddr = kWorkerIp.s_addr;
  ip->daddr = kAggregatorIp.s_addr;
  auto* udp = reinterpret_cast<udphdr*>(ip + 1);
  udp->source = htons(kWorkerPort);
  udp->dest = htons(wire::kDefaultDataPort);
  udp->len = htons(static_cast<uint16_t>(frame.size() - sizeof(ethhdr) - sizeof(iphdr)));
  auto packet = std::as_writable_bytes(std::span(frame).subspan(sizeof(ethhdr) + sizeof(iphdr) + sizeof(udphdr)));
  wire::encode_header({wire::MsgType::Data, kJobId, kToken, 0, 0, 0, wire::ElemOp::Sum, 0}, packet);
  int32_t* values = wire::payload(packet.data());
  for (size_t i = 0; i < wire::kChunkElems; i++) values[i] = static_cast<int32_t>(i) - 1000;
  return frame;
}

class Feed {
 public:
  explicit Feed(const CapacityOptions& options) : options_(options), frame_(data_frame()) {
    dataplane_ = dataplane::Dataplane::load({});
    feed_.reset(capacity_feed_bpf__open_and_load());
    if (!feed_) throw std::runtime_error(fmt::format("loading the capacity feeder: {}", std::strerror(errno)));
    uint32_t zero = 0;
    check(bpf_map_update_elem(bpf_map__fd(feed_->maps.feed_template), &zero, frame_.data(), BPF_ANY),
          "writing the frame template");
  }

  // Feeds cpus.size() senders, one per CPU on its own share of the chunks;
  // without the aggregator only the feeder runs (the harness's own cost).
  Rate measure(const std::vector<int>& cpus, bool ranks_first, bool aggregate) {
    const uint32_t chunks = static_cast<uint32_t>((uint64_t{options_.gradient_mib} << 20) / kChunkBytes);
    dataplane::JobSpec job{kJobId, kToken, options_.world_size, chunks, kBroadcastIp, kWorkerPort, {}};
    for (uint32_t rank = 0; rank < options_.world_size; rank++) job.workers.push_back({rank, kWorkerIp, kWorkerPort});
    dataplane_->add_job(job);  // a fresh job per measurement: empty cells, zero counters
    struct RemoveJob {
      dataplane::Dataplane& dataplane;
      ~RemoveJob() { dataplane.remove_job(kJobId); }
    } remove_job{*dataplane_};

    uint32_t zero = 0;
    int target = dataplane_->program_fd();
    int target_map = bpf_map__fd(feed_->maps.feed_target);
    if (aggregate)
      check(bpf_map_update_elem(target_map, &zero, &target, BPF_ANY), "installing the aggregator as tail call");
    else
      bpf_map_delete_elem(target_map, &zero);

    std::vector<feed_state> states(libbpf_num_possible_cpus());
    for (size_t k = 0; k < cpus.size(); k++) {
      uint32_t first = static_cast<uint32_t>(chunks * k / cpus.size());
      uint32_t end = static_cast<uint32_t>(chunks * (k + 1) / cpus.size());
      states.at(cpus[k]) = {0, first, 0, options_.world_size, first, end, ranks_first ? 1u : 0u, 0};
    }
    check(bpf_map_update_elem(bpf_map__fd(feed_->maps.feed_states), &zero, states.data(), BPF_ANY),
          "setting the senders");

    std::vector<uint64_t> frames(cpus.size());
    const auto deadline = after(options_.seconds);
    auto times = run_pinned(cpus, [&](size_t k) { frames[k] = feed_until(deadline); });

    uint64_t total = 0;
    for (uint64_t n : frames) total += n;
    Rate rate{"xdp", "", cpus.size(), total * kChunkBytes};
    if (!aggregate) rate.setup = "feeder alone (harness cost)";
    else rate.setup = fmt::format("{}, {} ranks", ranks_first ? "ranks interleaved" : "rank after rank", options_.world_size);
    dataplane::CounterRow counters = dataplane_->job_counters(kJobId);
    uint64_t other = 0;
    for (int counter = 0; counter < XAGG_CNT_COUNT; counter++)
      if (counter != XAGG_CNT_AGGREGATED && counter != XAGG_CNT_COMPLETED) other += counters[counter];
    const uint64_t aggregated = counters[XAGG_CNT_AGGREGATED], completed = counters[XAGG_CNT_COMPLETED];
    // Every frame must have been added (or completed a chunk): no duplicate, stale or dropped frame.
    const bool add_path = aggregate ? aggregated + completed == total && other == 0 && completed > 0
                                    : aggregated + completed + other == 0;
    rate.checks = {{"frames", total},
                   {"aggregated", aggregated},
                   {"completed", completed},
                   {"other_outcomes", other},
                   {"add_path", add_path}};
    return with_times(std::move(rate), times);
  }

 private:
  static void check(int rc, const std::string& what) {
    if (rc < 0) throw std::runtime_error(fmt::format("{}: {}", what, std::strerror(-rc)));
  }

  uint64_t feed_until(Clock::time_point deadline) const {
    xdp_md context{};
    context.data_end = static_cast<uint32_t>(frame_.size());  // the kernel insists
    uint64_t frames = 0;
    uint32_t repeat = kFirstCallFrames;
    for (auto now = Clock::now(); now < deadline;) {
      LIBBPF_OPTS(bpf_test_run_opts, run, .data_in = frame_.data(), .data_size_in = static_cast<uint32_t>(frame_.size()),
                  .ctx_in = &context, .ctx_size_in = sizeof(context), .repeat = static_cast<int>(repeat));
      check(bpf_prog_test_run_opts(bpf_program__fd(feed_->progs.xcap_feed), &run), "BPF_PROG_RUN");
      frames += repeat;
      const auto end = Clock::now();
      const double per_second = repeat / std::max(Seconds(end - now).count(), 1e-6);
      const double left = std::min(kSecondsPerCall, Seconds(deadline - end).count());
      repeat = static_cast<uint32_t>(std::clamp(per_second * left, 1024.0, double(INT32_MAX)));
      now = end;
    }
    return frames;
  }

  const CapacityOptions& options_;
  std::vector<uint8_t> frame_;
  std::unique_ptr<dataplane::Dataplane> dataplane_;
  std::unique_ptr<capacity_feed_bpf, FeedDeleter> feed_;
};

// ---- TCP parameter server --------------------------------------------------

// The server process restricted to server_cpus; client threads on client_cpus
// all-reduce a prepared gradient back to back. The first all-reduce warms up.
Rate measure_tcp_ps(const CapacityOptions& options, const std::string& netns, const std::vector<int>& server_cpus,
                    const std::vector<int>& client_cpus) {
  const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  xagg::Process server({{"taskset", "-c", fmt::format("{}", fmt::join(server_cpus, ",")), self, "tcp-ps-server",
                            "--bind", "127.0.0.1", "--port", std::to_string(kTcpPort), "--world-size",
                            std::to_string(options.world_size)},
                           netns,
                           std::nullopt});
  testbed::wait_for_tcp_port(netns, "127.0.0.1", kTcpPort, server, Clock::now() + std::chrono::seconds(10));

  const clockid_t server_cpu = process_cpu_clock(server.pid());
  const size_t elements = (size_t{options.tcp_mib} << 20) / sizeof(float);
  int done = -1;  // all-reduces finished by every client
  bool stop = false;
  Clock::time_point start, end;
  double cpu_start = 0, cpu_end = 0;
  auto step = [&]() noexcept {
    ++done;
    if (done == 1) {
      start = Clock::now();
      cpu_start = clock_seconds(server_cpu);
    } else if (done > 1 && Clock::now() - start >= Seconds(options.seconds)) {
      end = Clock::now();
      cpu_end = clock_seconds(server_cpu);
      stop = true;
    }
  };
  std::barrier sync(static_cast<ptrdiff_t>(options.world_size), step);
  std::vector<std::exception_ptr> errors(options.world_size);
  {
    std::vector<std::jthread> clients;
    for (uint32_t rank = 0; rank < options.world_size; rank++)
      clients.emplace_back([&, rank] {
        try {
          testbed::run_in_netns(netns, [&] {
            pin_to(client_cpus);
            baselines::TcpPsClient client({.servers = {"127.0.0.1"}, .port = kTcpPort, .rank = rank,
                                           .world_size = options.world_size, .max_elements = elements});
            std::vector<float> gradient(elements, 1.0f);
            for (sync.arrive_and_wait(); !stop; sync.arrive_and_wait())
              client.allreduce(gradient.data(), elements, ReduceOp::Average);  // stays 1.0: no Inf, no denormals
          });
        } catch (...) {
          errors[rank] = std::current_exception();
          sync.arrive_and_drop();
        }
      });
  }
  server.terminate();
  for (auto& error : errors)
    if (error) std::rethrow_exception(error);

  Rate rate{"tcp-ps", fmt::format("{} clients on CPU {}, {} MiB", options.world_size, fmt::join(client_cpus, ","),
                                  options.tcp_mib),
            server_cpus.size(), (done - 1) * uint64_t{options.world_size} * elements * sizeof(float)};
  rate.wall_s = Seconds(end - start).count();
  rate.cpu_s = cpu_end - cpu_start;
  rate.checks = {{"allreduces", done - 1}};
  return rate;
}

// ---- Memory bandwidth ------------------------------------------------------

void add_into(int32_t* __restrict acc, const int32_t* __restrict in, size_t n) {
  for (size_t i = 0; i < n; i++) acc[i] += in[i];
}

// acc += in over buffers far larger than the caches, split over the CPUs.
Rate measure_memory(const CapacityOptions& options, const std::vector<int>& cpus) {
  const size_t n = (size_t{options.memory_mib} << 20) / sizeof(int32_t);
  std::vector<int32_t> acc(n), in(n, 1);  // written once here: no page faults while timed
  std::vector<uint64_t> bytes(cpus.size());
  const auto deadline = after(options.seconds);
  auto times = run_pinned(cpus, [&](size_t k) {
    const size_t first = n * k / cpus.size(), count = n * (k + 1) / cpus.size() - first;
    while (Clock::now() < deadline) {
      add_into(acc.data() + first, in.data() + first, count);
      bytes[k] += count * sizeof(int32_t);
    }
  });
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  Rate rate{"memory", fmt::format("acc[i] += in[i], 2 x {} MiB", options.memory_mib), cpus.size(), total};
  rate.checks = {{"memory_traffic_bytes", 3 * total}};  // read acc, read in, write acc
  return with_times(std::move(rate), times);
}

// ---- Report ----------------------------------------------------------------

void print_row(const Rate& r) {
  fmt::print("{:<7} {:<36} {:>5} {:>7.2f} {:>6.2f} {:>6.2f} {:>5.0f} {:>8.2f} {:>11.2f} {:>8.0f}\n", r.system, r.setup,
             r.cores, r.payload_bytes / 1e9, r.wall_s, r.cpu_s, r.busy() * 100, r.gbps(), r.gbps_per_core(),
             r.ns_per_chunk());
  std::fflush(stdout);
}

nlohmann::json to_json(const Rate& r) {
  return {{"system", r.system},   {"setup", r.setup},   {"cores", r.cores},
          {"payload_bytes", r.payload_bytes}, {"wall_s", r.wall_s}, {"cpu_s", r.cpu_s},
          {"gbps", r.gbps()},     {"gbps_per_core", r.gbps_per_core()}, {"checks", r.checks}};
}

int run_capacity(const CapacityOptions& options) {
  if (geteuid() != 0) throw std::runtime_error("bench capacity must run as root (BPF programs, network namespaces)");
  // Opened before the measurements, so that a path that cannot be written fails at once, not after them.
  std::ofstream json_file;
  if (!options.json_file.empty()) {
    json_file = open_output(options.json_file);
  }
  const std::vector<int> one{options.cpus.at(0)};
  const std::vector<int>& two = options.cpus;
  std::optional<ScratchNetns> netns;  // the TCP PS's loopback
  if (options.runs("tcp-ps")) netns.emplace(options.netns);

  fmt::print("# gradient payload summed. Gbit/s: over wall time; Gbit/s/core: over the CPU time of the threads (xdp,\n"
             "# memory) or the server process (tcp-ps) doing it; busy: that CPU time / (wall x cores), low when other\n"
             "# work shares the cores; ns/chunk: CPU time per {} payload bytes\n", kChunkBytes);
  fmt::print("{:<7} {:<36} {:>5} {:>7} {:>6} {:>6} {:>5} {:>8} {:>11} {:>8}\n", "system", "setup", "cores", "GB",
             "wall s", "CPU s", "busy%", "Gbit/s", "Gbit/s/core", "ns/chunk");
  std::vector<Rate> rates;
  auto record = [&](Rate rate) {
    print_row(rate);
    rates.push_back(std::move(rate));
    return rates.back();
  };
  nlohmann::json scaling = nlohmann::json::object();
  // By wall time, and by CPU time (what two fully available cores would give).
  auto scale = [&](const std::string& name, const Rate& single, const Rate& both) {
    scaling[name] = {{"wall", single.gbps() > 0 ? both.gbps() / single.gbps() : 0},
                     {"cpu_time", single.gbps_per_core() > 0 ? 2 * both.gbps_per_core() / single.gbps_per_core() : 0}};
  };

  if (options.runs("xdp")) {
    Feed feed(options);
    record(feed.measure(one, true, false));
    for (bool ranks_first : {true, false}) {
      Rate single = record(feed.measure(one, ranks_first, true));
      Rate both = record(feed.measure(two, ranks_first, true));
      scale(fmt::format("xdp {}", ranks_first ? "ranks interleaved" : "rank after rank"), single, both);
    }
  }
  if (options.runs("tcp-ps")) {
    Rate single = record(measure_tcp_ps(options, netns->name(), one, std::vector<int>(two.begin() + 1, two.end())));
    Rate both = record(measure_tcp_ps(options, netns->name(), two, two));
    scale("tcp-ps", single, both);
  }
  if (options.runs("memory")) {
    Rate single = record(measure_memory(options, one));
    Rate both = record(measure_memory(options, two));
    scale("memory", single, both);
  }

  for (const auto& [name, ratio] : scaling.items())
    fmt::print("# {}: 2 cores / 1 core = {:.2f} by wall time, {:.2f} by CPU time\n", name, ratio["wall"].get<double>(),
               ratio["cpu_time"].get<double>());

  bool add_path = true;
  for (const Rate& rate : rates)
    if (rate.checks.contains("add_path")) add_path = add_path && rate.checks["add_path"].get<bool>();
  if (json_file.is_open()) {
    nlohmann::json results = nlohmann::json::array();
    for (const Rate& rate : rates) results.push_back(to_json(rate));
    nlohmann::json document{{"seconds", options.seconds},       {"cpus", options.cpus},
                            {"world_size", options.world_size}, {"gradient_bytes", uint64_t{options.gradient_mib} << 20},
                            {"chunk_payload_bytes", kChunkBytes}, {"results", results},
                            {"scaling", scaling}};
    json_file << document.dump(2) << "\n";
    close_output(json_file, options.json_file);
    fmt::print("wrote {}\n", options.json_file);
  }
  if (!add_path) spdlog::error("some XDP frames did not take the add path (see the checks in the JSON)");
  return add_path ? 0 : 1;
}

}  // namespace

void add_capacity_command(CLI::App& bench) {
  auto options = std::make_shared<CapacityOptions>();
  auto* command = bench.add_subcommand(
      "capacity", "Gbit/s of gradient payload summed per aggregator core: XDP, TCP PS, memory ceiling");
  command->add_option("--seconds", options->seconds, "Per measurement")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--cpus", options->cpus, "Two CPUs: the 1-core runs use the first")
      ->delimiter(',')
      ->expected(2)
      ->capture_default_str();
  command->add_option("--world-size", options->world_size, "Ranks of the XDP job and TCP PS clients")
      ->check(CLI::Range(2, XAGG_MAX_WORKERS))
      ->capture_default_str();
  command->add_option("--gradient-mib", options->gradient_mib, "Gradient of the XDP job (its cells take about 2x)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  command->add_option("--tcp-mib", options->tcp_mib, "Tensor per TCP all-reduce")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  command->add_option("--memory-mib", options->memory_mib, "Each of the two summed buffers")
      ->check(CLI::Range(1, 8192))
      ->capture_default_str();
  command->add_option("--systems", options->systems, "What to measure")
      ->delimiter(',')
      ->check(CLI::IsMember({"xdp", "tcp-ps", "memory"}))
      ->capture_default_str();
  command->add_option("--netns", options->netns, "Scratch network namespace (created and deleted)")
      ->capture_default_str();
  command->add_option("--json", options->json_file, "Write the figures here");
  command->callback([options] {
    // The same CPU twice would measure one core as two.
    if (options->cpus[0] == options->cpus[1]) throw CLI::ValidationError("--cpus", "the two CPUs must differ");
    if (run_capacity(*options) != 0) throw std::runtime_error("the XDP program did not take the add path");
  });
}

}  // namespace xagg::bench
