#include "counters.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace xagg::dataplane {

std::string_view counter_name(xagg_counter counter) {
  switch (counter) {
    case XAGG_CNT_AGGREGATED: return "aggregated";
    case XAGG_CNT_COMPLETED: return "completed";
    case XAGG_CNT_DUPLICATE: return "duplicate";
    case XAGG_CNT_RESENT: return "resent";
    case XAGG_CNT_STALE: return "stale";
    case XAGG_CNT_MALFORMED: return "malformed";
    case XAGG_CNT_BAD_VERSION: return "bad_version";
    case XAGG_CNT_UNKNOWN_JOB: return "unknown_job";
    case XAGG_CNT_BAD_TOKEN: return "bad_token";
    case XAGG_CNT_UNKNOWN_WORKER: return "unknown_worker";
    case XAGG_CNT_WRONG_SOURCE: return "wrong_source";
    case XAGG_CNT_OUT_OF_RANGE: return "out_of_range";
    case XAGG_CNT_OP_MISMATCH: return "op_mismatch";
    case XAGG_CNT_LENGTH_MISMATCH: return "length_mismatch";
    case XAGG_CNT_CONTENDED: return "contended";
    case XAGG_CNT_UNICAST_COPIES: return "unicast_copies";
    case XAGG_CNT_SENT_UP: return "sent_up";
    case XAGG_CNT_RELAYED_DOWN: return "relayed_down";
    case XAGG_CNT_SCATTER_HEADERS: return "scatter_headers";
    case XAGG_CNT_COUNT: break;
  }
  return "unknown";
}

CounterRow CounterSnapshot::total() const {
  CounterRow sum = no_job;
  for (const JobCounters& job : jobs)
    for (size_t i = 0; i < sum.size(); i++) sum[i] += job.counters[i];
  return sum;
}

CounterRow read_counter_row(int stats_fd, uint32_t row) {
  int cpus = libbpf_num_possible_cpus();
  if (cpus <= 0) throw std::runtime_error("cannot count the possible CPUs");
  std::vector<uint64_t> per_cpu(cpus);
  CounterRow sums{};
  for (uint32_t counter = 0; counter < XAGG_CNT_COUNT; counter++) {
    uint32_t key = row * XAGG_CNT_COUNT + counter;
    if (bpf_map_lookup_elem(stats_fd, &key, per_cpu.data()) != 0)
      throw std::runtime_error(fmt::format("reading counter {}: {}", key, std::strerror(errno)));
    for (uint64_t value : per_cpu) sums[counter] += value;
  }
  return sums;
}

CounterSnapshot read_counters(int stats_fd, int jobs_fd) {
  CounterSnapshot snapshot;
  uint32_t job_id = 0;
  const uint32_t* previous = nullptr;
  while (bpf_map_get_next_key(jobs_fd, previous, &job_id) == 0) {
    previous = &job_id;
    xagg_job job{};
    if (bpf_map_lookup_elem(jobs_fd, &job_id, &job) != 0) continue;  // removed meanwhile
    // A key deleted meanwhile restarts the walk from the first key.
    if (std::ranges::any_of(snapshot.jobs, [&](const JobCounters& seen) { return seen.job_id == job_id; })) continue;
    snapshot.jobs.push_back({job_id, job.slot, read_counter_row(stats_fd, job.slot)});
  }
  std::ranges::sort(snapshot.jobs, {}, &JobCounters::slot);
  snapshot.no_job = read_counter_row(stats_fd, XAGG_STATS_NO_JOB_ROW);
  return snapshot;
}

std::string interface_key(std::string_view ifname) {
  struct stat netns {};
  if (stat("/proc/thread-self/ns/net", &netns) != 0)
    throw std::runtime_error(fmt::format("cannot identify the network namespace: {}", std::strerror(errno)));
  return fmt::format("net{}-{}", netns.st_ino, ifname);
}

std::string pin_dir(std::string_view ifname) { return "/sys/fs/bpf/xagg/" + interface_key(ifname); }

namespace {
UniqueFd open_pinned(const std::string& path) {
  int fd = bpf_obj_get(path.c_str());
  if (fd < 0)
    throw std::runtime_error(fmt::format("cannot open {}: {} (is `xagg aggregator` running on this "
                                         "interface, in this network namespace?)",
                                         path, std::strerror(errno)));
  return UniqueFd(fd);
}
}  // namespace

PinnedCounters::PinnedCounters(std::string_view ifname)
    : stats_(open_pinned(pin_dir(ifname) + "/xagg_stats")), jobs_(open_pinned(pin_dir(ifname) + "/xagg_jobs")) {}

}  // namespace xagg::dataplane
