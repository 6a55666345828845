#include "reliability_support.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fmt/format.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "cluster.h"
#include "unique_fd.h"

namespace xagg::reliability {
namespace {

std::vector<std::string> argv_of(pid_t pid) {
  std::ifstream file(fmt::format("/proc/{}/cmdline", pid), std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t start = 0; start < all.size();) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    args.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return args;
}

pid_t parent_of(pid_t pid) {
  std::ifstream file(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  size_t after_name = stat.rfind(')');  // the command name may hold spaces
  if (after_name == std::string::npos) return -1;
  char state = 0;
  pid_t parent = -1;
  std::sscanf(stat.c_str() + after_name + 1, " %c %d", &state, &parent);
  return parent;
}

bool program_exists(uint32_t id) { return UniqueFd(bpf_prog_get_fd_by_id(id)).get() >= 0; }
bool map_exists(uint32_t id) { return UniqueFd(bpf_map_get_fd_by_id(id)).get() >= 0; }

bpf_map_info map_info(int fd) {
  bpf_map_info info{};
  uint32_t length = sizeof(info);
  bpf_obj_get_info_by_fd(fd, &info, &length);
  return info;
}

}  // namespace

std::optional<pid_t> find_child(const std::vector<std::string>& args) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::string name = entry.path().filename();
    if (!std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    pid_t pid = std::stoi(name);
    if (parent_of(pid) != getpid()) continue;
    std::vector<std::string> argv = argv_of(pid);
    if (std::search(argv.begin(), argv.end(), args.begin(), args.end()) != argv.end()) return pid;
  }
  return std::nullopt;
}

std::optional<nlohmann::json> job_counters(const std::filesystem::path& xagg_binary, const testbed::Testbed& bed,
                                           uint32_t job_id) {
  xagg::Process stats({.argv = {xagg_binary, "stats", "--interface", testbed::kHostInterface, "--count", "1", "--json"},
                          .netns = bed.aggregator().netns,
                          .output_file = std::nullopt});
  xagg::ProcessResult result = stats.wait(xagg::Clock::now() + std::chrono::seconds(10));
  if (result.exit_code != 0) return std::nullopt;  // no aggregator (yet)
  for (const auto& line : testbed::worker_reports(result.output))  // the JSON lines of the output
    for (const auto& job : line.value("jobs", nlohmann::json::array()))
      if (job.at("job").get<uint32_t>() == job_id) return job.at("counters");
  return std::nullopt;
}

KernelObjects aggregator_objects(const testbed::Testbed& bed) {
  KernelObjects objects;
  testbed::run_in_netns(bed.aggregator().netns, [&] {
    int ifindex = static_cast<int>(if_nametoindex(testbed::kHostInterface));
    if (ifindex == 0 || bpf_xdp_query_id(ifindex, 0, &objects.program_id) != 0) objects.program_id = 0;
  });
  if (objects.program_id == 0) return objects;
  UniqueFd program(bpf_prog_get_fd_by_id(objects.program_id));
  if (!program) return objects;
  std::vector<uint32_t> ids(64);
  bpf_prog_info info{};
  info.nr_map_ids = static_cast<uint32_t>(ids.size());
  info.map_ids = reinterpret_cast<uint64_t>(ids.data());
  uint32_t length = sizeof(info);
  if (bpf_obj_get_info_by_fd(program.get(), &info, &length) != 0) return objects;
  ids.resize(std::min<size_t>(info.nr_map_ids, ids.size()));
  objects.map_ids = ids;
  auto account = [&](int fd) {
    bpf_map_info map = map_info(fd);
    objects.map_bytes += uint64_t{map.key_size + map.value_size} * map.max_entries;
    return map;
  };
  for (uint32_t id : ids) {
    UniqueFd map(bpf_map_get_fd_by_id(id));
    if (!map) continue;
    bpf_map_info outer = account(map.get());
    if (outer.type != BPF_MAP_TYPE_ARRAY_OF_MAPS) continue;
    for (uint32_t slot = 0; slot < outer.max_entries; ++slot) {
      uint32_t inner_id = 0;
      if (bpf_map_lookup_elem(map.get(), &slot, &inner_id) != 0) continue;
      objects.cell_map_ids.push_back(inner_id);
      if (UniqueFd inner(bpf_map_get_fd_by_id(inner_id)); inner) account(inner.get());
    }
  }
  return objects;
}

std::vector<std::string> surviving(const KernelObjects& objects) {
  std::vector<std::string> alive;
  if (objects.program_id && program_exists(objects.program_id))
    alive.push_back(fmt::format("program {}", objects.program_id));
  for (const auto* ids : {&objects.map_ids, &objects.cell_map_ids})
    for (uint32_t id : *ids)
      if (map_exists(id)) alive.push_back(fmt::format("map {}", id));
  return alive;
}

std::vector<std::string> wait_until_freed(const KernelObjects& objects, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> alive;
  while (!(alive = surviving(objects)).empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return alive;
}

uint64_t resident_kb(pid_t pid) {
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  return 0;
}

double series(const std::string& text, const std::string& name) {
  const std::string line_start = "\n" + name + " ";
  const size_t at = text.find(line_start);
  return at == std::string::npos ? -1 : std::stod(text.substr(at + line_start.size()));
}

double cpu_seconds(pid_t pid) {
  std::ifstream stat_file(fmt::format("/proc/{}/stat", pid));
  std::string text((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) start at its closing parenthesis;
  // utime and stime are fields 14 and 15, the 12th and 13th after it.
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  uint64_t ticks = 0;
  for (int index = 3; index <= 15 && fields >> field; ++index)
    if (index >= 14) ticks += std::stoull(field);
  return static_cast<double>(ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

size_t open_descriptors(pid_t pid) {
  auto entries = std::filesystem::directory_iterator(fmt::format("/proc/{}/fd", pid));
  return static_cast<size_t>(std::distance(std::filesystem::begin(entries), std::filesystem::end(entries)));
}

}  // namespace xagg::reliability
