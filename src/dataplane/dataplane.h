// User-space side of the XDP aggregator: loads the program (libbpf skeleton),
// attaches it to an interface, pins its maps and manages jobs in its maps.
#pragma once

#include <linux/capability.h>
#include <netinet/in.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "capabilities.h"
#include "counters.h"
#include "unique_fd.h"
#include "wire.h"

struct xagg_aggregator_bpf;
struct xagg_unicast_bpf;

namespace xagg::dataplane {

enum class AttachMode { Native, Generic };

// XDP_FLAGS_DRV_MODE or XDP_FLAGS_SKB_MODE.
uint32_t xdp_mode_flags(AttachMode mode);

// The kernel's name of the aggregator's XDP program: what tells an
// aggregator's program on an interface from anybody else's.
inline constexpr const char* kProgramName = "xagg_aggregate";

// Name of the BPF program with this id; empty once it is gone.
std::string program_name(uint32_t prog_id);

struct LoadOptions {
  uint16_t udp_port = wire::kDefaultDataPort;  // DATA packets are sent to this port
  bool result_fan_out = false;  // results leave from the next CPU, not the one that completed the chunk
};

struct WorkerSpec {
  uint32_t rank = 0;
  in_addr ipv4{};     // address DATA must come from
  uint16_t port = 0;  // UDP port DATA must come from (host order)
};

// A leaf job's membership in its parent aggregator's job (docs/design.md,
// "Hierarchy"): its completed chunks go up to the parent as this leaf's share.
struct UplinkSpec {
  in_addr parent_ip{};
  uint16_t parent_port = 0;  // the parent's data port (host order)
  uint32_t parent_job_id = 0;
  uint64_t parent_token = 0;
  uint32_t parent_rank = 0;  // this leaf's rank in the parent's job
  in_addr local_ip{};        // this aggregator's address the parent knows
  std::array<uint8_t, 6> local_mac{};     // of the aggregator's interface
  std::array<uint8_t, 6> next_hop_mac{};  // towards the parent: it, or the router before it
};

struct JobSpec {
  uint32_t job_id = 0;
  uint64_t token = 0;
  uint32_t world_size = 0;   // 1 .. XAGG_MAX_WORKERS
  uint32_t chunks = 0;       // chunk indexes 0 .. chunks-1
  in_addr result_ip{};       // broadcast or multicast: where RESULTs go (unicast: each worker's address)
  uint16_t result_port = 0;  // host order
  std::vector<WorkerSpec> workers;  // may be empty; add_worker adds more later
  uint32_t chunk_elements = wire::kChunkElems;  // of its chunks (1 .. kMaxChunkElems): sizes its cells
  wire::ResultMode results = wire::ResultMode::Broadcast;
  std::optional<UplinkSpec> uplink = std::nullopt;  // set: a leaf job
  // A 16-bit SUM's result is its cell's sum / 2^sum_shift (docs/protocol.md section 11), 0 .. 6.
  uint32_t sum_shift = 0;
};

// What one aggregation cell holds (struct xagg_chunk without its elements).
struct CellState {
  bool started = false;        // false until the first share of any iteration landed
  uint32_t iteration_tag = 0;  // iteration the cell aggregates
  uint64_t arrived = 0;        // bit r: rank r's share of that iteration is in
  uint32_t total = 0;          // element count of the all-reduce those shares belong to
  // A share of that iteration whose all-reduce had another element count: its
  // count (0: none) and rank.
  uint32_t conflict_total = 0;
  uint32_t conflict_rank = 0;
};

// The kernel's run-time accounting of the XDP program, collected only while
// kernel.bpf_stats_enabled is 1 (or a BPF_ENABLE_STATS descriptor is open).
struct ProgramRunStats {
  uint64_t run_time_ns = 0;
  uint64_t runs = 0;
};

// What the data plane needs instead of root: programs and maps (CAP_BPF), the
// XDP attachment (CAP_NET_ADMIN), and the verifier accepts the program's
// pointer arithmetic only with CAP_PERFMON.
inline constexpr std::array<Capability, 3> kRequiredCapabilities{
    {{CAP_BPF, "CAP_BPF"}, {CAP_NET_ADMIN, "CAP_NET_ADMIN"}, {CAP_PERFMON, "CAP_PERFMON"}}};

class Dataplane {
 public:
  // Opens and loads the program; it can then be run with BPF_PROG_TEST_RUN
  // (program_fd()) without being attached. Throws std::runtime_error.
  static std::unique_ptr<Dataplane> load(const LoadOptions& options);
  ~Dataplane();  // detaches, unpins and frees every job
  Dataplane(const Dataplane&) = delete;
  Dataplane& operator=(const Dataplane&) = delete;

  // Attaches to ifname and pins the maps under pin_dir(ifname), replacing the
  // leftovers of a crashed run. Throws std::runtime_error saying what to fix.
  void attach(const std::string& ifname, AttachMode mode);

  // Registers a job in the lowest free slot (next_free_slot()) and returns
  // the slot. The job entry is written last, so XDP ignores the job until it
  // is complete. Throws std::runtime_error (no free slot, duplicate job id, ...).
  uint32_t add_job(const JobSpec& job);
  void add_worker(uint32_t job_id, const WorkerSpec& worker);
  // Unknown job ids are ignored. The job's counters are cleared.
  void remove_job(uint32_t job_id);
  std::optional<uint32_t> next_free_slot() const;
  // The cell of chunk for iteration's parity (docs/protocol.md 3.3), read
  // without its lock: a diagnostic snapshot. Throws std::invalid_argument for
  // an unknown job, std::runtime_error for a chunk out of range.
  CellState cell_state(uint32_t job_id, uint32_t chunk, uint32_t iteration) const;

  CounterSnapshot counters() const;
  CounterRow job_counters(uint32_t job_id) const;  // zeros for an unknown job
  CounterRow no_job_counters() const;

  int program_fd() const;
  ProgramRunStats program_run_stats() const;

 private:
  struct Job {
    uint32_t slot = 0;
    xagg_cell_class cell_class{};  // whose map of maps holds its cells
    UniqueFd cells;  // inner array; the outer map holds its own reference
    std::set<uint32_t> ranks;
    std::optional<xagg_parent_key> parent;  // a leaf job's entry in xagg_parents
  };
  struct Attachment;  // attached interface and pinned maps, undone on destruction

  Dataplane() = default;
  void fill_fan_out_maps(int ifindex);
  // Loads the tc unicast fan-out on the aggregator's maps (xagg_unicast.bpf.c).
  void load_unicast_fan_out();
  void write_worker(uint32_t job_id, const WorkerSpec& worker);
  void delete_job_maps(uint32_t job_id, const Job& job);
  void clear_counter_row(uint32_t row);
  int cell_map_fd(xagg_cell_class cell_class) const;  // the class's map of maps

  struct SkeletonDeleter {
    void operator()(xagg_aggregator_bpf* skeleton) const;
  };
  std::unique_ptr<xagg_aggregator_bpf, SkeletonDeleter> skeleton_;
  struct UnicastDeleter {
    void operator()(xagg_unicast_bpf* skeleton) const;
  };
  std::unique_ptr<xagg_unicast_bpf, UnicastDeleter> unicast_;
  std::map<uint32_t, Job> jobs_;  // by job id
  std::unique_ptr<Attachment> attachment_;  // destroyed before skeleton_
};

}  // namespace xagg::dataplane
