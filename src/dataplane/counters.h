// Data-plane outcome counters (enum xagg_counter), summed over CPUs, read
// either from a running Dataplane or from the maps it pins for `xagg stats`.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "unique_fd.h"
#include "xagg_structs.h"

namespace xagg::dataplane {

using CounterRow = std::array<uint64_t, XAGG_CNT_COUNT>;

std::string_view counter_name(xagg_counter counter);  // e.g. "aggregated"

struct JobCounters {
  uint32_t job_id = 0;
  uint32_t slot = 0;
  CounterRow counters{};
};

struct CounterSnapshot {
  std::vector<JobCounters> jobs;  // every job in the jobs map, by slot
  CounterRow no_job{};            // packets that named no known job
  CounterRow total() const;       // jobs plus no_job
};

// Reads the per-CPU stats map and the jobs map given by their fds.
CounterSnapshot read_counters(int stats_fd, int jobs_fd);
CounterRow read_counter_row(int stats_fd, uint32_t row);

// Names an interface of the caller's network namespace uniquely on the host:
// bpffs pins and lock files are shared by all network namespaces, and every
// testbed namespace has its own eth0.
std::string interface_key(std::string_view ifname);

// Directory where a Dataplane attached to ifname pins its maps.
std::string pin_dir(std::string_view ifname);

// The pinned maps of a running aggregator, opened from another process.
class PinnedCounters {
 public:
  // Throws std::runtime_error if no aggregator has pinned maps for ifname.
  explicit PinnedCounters(std::string_view ifname);
  CounterSnapshot read() const { return read_counters(stats_.get(), jobs_.get()); }

 private:
  UniqueFd stats_;
  UniqueFd jobs_;
};

}  // namespace xagg::dataplane
