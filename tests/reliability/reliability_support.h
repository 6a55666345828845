// Shared by the reliability tests and the soak driver: fault injection into
// processes the test started, and inspection of the aggregator's kernel objects.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "testbed.h"

namespace xagg::reliability {

// A child of this process whose argv contains every one of `args` in order
// (e.g. {"worker", "--rank", "1"}); children only, so nothing else is ever hit.
std::optional<pid_t> find_child(const std::vector<std::string>& args);

// One job's counters by name ("resent", ...), as `xagg stats --json` prints
// them for the aggregator of the testbed; nullopt while the job does not exist.
std::optional<nlohmann::json> job_counters(const std::filesystem::path& xagg_binary, const testbed::Testbed& bed,
                                           uint32_t job_id);

// The kernel objects behind an aggregator: the XDP program attached to the
// aggregator's eth0, the maps it uses and every job's cell array.
struct KernelObjects {
  uint32_t program_id = 0;  // 0: nothing attached
  std::vector<uint32_t> map_ids;
  std::vector<uint32_t> cell_map_ids;  // inner arrays of the xagg_cells_* maps of maps, one per live job
  uint64_t map_bytes = 0;              // key + value bytes of all of them, times their entries
};
KernelObjects aggregator_objects(const testbed::Testbed& bed);
// Ids of those objects that still exist in the kernel.
std::vector<std::string> surviving(const KernelObjects& objects);
// Polls (the kernel frees programs and maps after an RCU grace period) until
// none survives or the timeout passes; returns the survivors.
std::vector<std::string> wait_until_freed(const KernelObjects& objects, std::chrono::seconds timeout);

// The value of one series ("name" or "name{labels}") in a /metrics scrape; -1 if absent.
double series(const std::string& text, const std::string& name);

// Resident memory of a process in kB (VmRSS), 0 when it is gone.
uint64_t resident_kb(pid_t pid);
// User plus system CPU time the process has used, in seconds.
double cpu_seconds(pid_t pid);
// Descriptors the process holds open.
size_t open_descriptors(pid_t pid);

}  // namespace xagg::reliability
