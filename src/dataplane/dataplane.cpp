#include "dataplane.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fmt/format.h>
#include <linux/if_link.h>
#include <linux/magic.h>
#include <net/if.h>
#include <spdlog/spdlog.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "inet.h"
#include "wire.h"
#include "xagg_aggregator.skel.h"
#include "xagg_unicast.skel.h"

namespace xagg::dataplane {
namespace {

constexpr const char* kBpffsRoot = "/sys/fs/bpf";
constexpr const char* kRuntimeDir = "/run/xagg";  // interface locks
// The unicast fan-out's place among the interface's clsact ingress filters
// (priority 1 runs first); a crashed aggregator's filter there is replaced.
constexpr uint32_t kUnicastFilterPriority = 1;
constexpr uint32_t kUnicastFilterHandle = 0x58414755;
// Results queued per fan-out CPU: a whole window's burst of completions.
constexpr uint32_t kFanOutQueueFrames = 8192;

// libbpf's messages (the verifier log among them) go through spdlog.
int log_libbpf(libbpf_print_level level, const char* format, va_list args) {
  char message[4096];
  int length = vsnprintf(message, sizeof(message), format, args);
  std::string_view text(message, std::clamp(length, 0, static_cast<int>(sizeof(message)) - 1));
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  // The kernel's answer to bpf_tc_hook_create on an interface that has a
  // clsact qdisc already, which attach() expects and keeps: not a warning.
  const bool expected = text.find("Exclusivity flag on, cannot modify") != std::string_view::npos;
  spdlog::log(level == LIBBPF_WARN && !expected ? spdlog::level::warn
              : level == LIBBPF_INFO || expected  ? spdlog::level::debug
                                                  : spdlog::level::trace,
              "libbpf: {}", text);
  return length;
}

[[noreturn]] void fail(const std::string& what, int error = errno) {
  throw std::runtime_error(fmt::format("{}: {}", what, std::strerror(error)));
}

// libbpf returns -errno and may leave errno untouched.
void check(int rc, const std::string& what) {
  if (rc < 0) fail(what, -rc);
}

// Creates a directory the daemon keeps state in; as a service it is provided
// (RuntimeDirectory=, ExecStartPre=), and a failure says so.
void create_state_directory(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error)
    throw std::runtime_error(fmt::format(
        "creating {}: {} (without root, {} and {}/xagg must be provided writable for this user: docs/operations.md)",
        dir, error.message(), kRuntimeDir, kBpffsRoot));
}

// Held while an aggregator runs on the interface, released by the kernel
// even on a crash: tells a live aggregator's pins from a crashed one's.
UniqueFd lock_interface(const std::string& ifname, std::string& path) {
  create_state_directory(kRuntimeDir);
  path = fmt::format("{}/{}.lock", kRuntimeDir, interface_key(ifname));
  for (;;) {
    UniqueFd lock(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!lock) fail("opening " + path);
    if (flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK)
        throw std::runtime_error(fmt::format("another xagg aggregator is running on {} (holds {})", ifname, path));
      fail("locking " + path);
    }
    // The holder before us unlinks the file on exit: a lock on an unlinked
    // file excludes no one, so lock the file the path names now.
    struct stat locked {}, named {};
    if (fstat(lock.get(), &locked) == 0 && stat(path.c_str(), &named) == 0 && locked.st_ino == named.st_ino &&
        locked.st_dev == named.st_dev)
      return lock;
  }
}

void ensure_bpffs_mounted() {
  struct statfs fs {};
  if (statfs(kBpffsRoot, &fs) == 0 && fs.f_type == BPF_FS_MAGIC) return;
  if (mount("bpf", kBpffsRoot, "bpf", 0, "mode=0700") != 0)
    fail(fmt::format("bpffs is not mounted at {} and mounting it failed (without CAP_SYS_ADMIN, mount it first: "
                     "mount -t bpf bpf {})",
                     kBpffsRoot, kBpffsRoot));
  spdlog::info("mounted bpffs at {}", kBpffsRoot);
}

// Removes an aggregator that a crashed run left attached to the interface.
void detach_leftover_program(int ifindex, const std::string& ifname) {
  LIBBPF_OPTS(bpf_xdp_query_opts, query);
  if (bpf_xdp_query(ifindex, 0, &query) != 0) return;
  for (auto [prog_id, mode] : {std::pair{query.drv_prog_id, XDP_FLAGS_DRV_MODE},
                               std::pair{query.skb_prog_id, XDP_FLAGS_SKB_MODE}}) {
    if (prog_id == 0 || program_name(prog_id) != kProgramName) continue;
    spdlog::warn("detaching XDP program {} left on {} by an earlier aggregator", prog_id, ifname);
    check(bpf_xdp_detach(ifindex, mode, nullptr), fmt::format("detaching the leftover program from {}", ifname));
  }
}

std::string attach_error(int error, const std::string& ifname, AttachMode mode, int ifindex) {
  switch (error) {
    case EPERM:
      return "attaching XDP needs root (or CAP_NET_ADMIN and CAP_BPF)";
    case EOPNOTSUPP:
      if (mode == AttachMode::Native)
        return fmt::format("the driver of {} cannot run XDP in native mode; use --generic", ifname);
      break;
    case EBUSY:
    case EEXIST: {
      uint32_t prog_id = 0;
      bpf_xdp_query_id(ifindex, 0, &prog_id);
      return fmt::format("{} already runs XDP program {}; remove it (ip link set dev {} xdp off)", ifname, prog_id,
                         ifname);
    }
  }
  return fmt::format("attaching XDP to {}: {}", ifname, std::strerror(error));
}

// Touches every page of a job's array through xagg_touch_cells, once the
// array is installed and before the job is registered.
void touch_cells(int program_fd, xagg_cell_class cell_class, uint32_t slot, uint32_t cell_count) {
  constexpr uint32_t kCellsPerRun = 1u << 22;  // below bpf_loop's limit
  for (uint32_t first = 0; first < cell_count; first += kCellsPerRun) {
    // BPF_PROG_RUN of XDP needs at least an Ethernet header's worth of data.
    std::array<std::byte, 64> frame{};
    xagg_touch_request request{cell_class, slot, first, std::min(kCellsPerRun, cell_count - first)};
    std::memcpy(frame.data(), &request, sizeof(request));
    LIBBPF_OPTS(bpf_test_run_opts, run, .data_in = frame.data(), .data_size_in = frame.size());
    check(bpf_prog_test_run_opts(program_fd, &run), "touching the job's memory");
    if (run.retval != XDP_PASS) throw std::runtime_error("touching the job's memory stopped before its end");
  }
}

bpf_tc_hook unicast_hook(int ifindex) {
  bpf_tc_hook hook{};
  hook.sz = sizeof(hook);
  hook.ifindex = ifindex;
  hook.attach_point = BPF_TC_INGRESS;
  return hook;
}

bpf_tc_opts unicast_filter_opts(int prog_fd) {
  bpf_tc_opts opts{};
  opts.sz = sizeof(opts);
  opts.handle = kUnicastFilterHandle;
  opts.priority = kUnicastFilterPriority;
  opts.prog_fd = prog_fd;
  return opts;
}

}  // namespace

uint32_t xdp_mode_flags(AttachMode mode) {
  return mode == AttachMode::Native ? XDP_FLAGS_DRV_MODE : XDP_FLAGS_SKB_MODE;
}

std::string program_name(uint32_t prog_id) {
  UniqueFd prog(bpf_prog_get_fd_by_id(prog_id));
  if (!prog) return {};
  bpf_prog_info info{};
  uint32_t length = sizeof(info);
  if (bpf_obj_get_info_by_fd(prog.get(), &info, &length) != 0) return {};
  return info.name;
}

struct Dataplane::Attachment {
  UniqueFd lock;  // released after everything below is undone
  std::string lock_path;
  // A bpf_link, not a netlink attachment: the kernel detaches the program
  // when the last fd closes, so a crashed daemon leaves no program behind
  // to swallow the data port's packets.
  UniqueFd link;
  std::string ifname;
  std::string pin_dir;
  std::vector<std::string> pinned;  // paths of pinned maps
  int ifindex = 0;
  // The tc fan-out is attached. Only its filter goes: the clsact qdisc may hold
  // others' filters by then, and an empty one costs nothing.
  bool unicast_filter = false;

  ~Attachment() {
    if (unicast_filter) {
      bpf_tc_hook hook = unicast_hook(ifindex);
      bpf_tc_opts opts = unicast_filter_opts(0);
      bpf_tc_detach(&hook, &opts);
    }
    for (const std::string& path : pinned) unlink(path.c_str());
    std::error_code ignored;
    std::filesystem::remove(pin_dir, ignored);
    link.reset();
    spdlog::info("detached XDP from {}", ifname);
    unlink(lock_path.c_str());
  }
};

void Dataplane::SkeletonDeleter::operator()(xagg_aggregator_bpf* skeleton) const {
  xagg_aggregator_bpf__destroy(skeleton);
}

void Dataplane::UnicastDeleter::operator()(xagg_unicast_bpf* skeleton) const { xagg_unicast_bpf__destroy(skeleton); }

std::unique_ptr<Dataplane> Dataplane::load(const LoadOptions& options) {
  libbpf_set_print(log_libbpf);
  require_capabilities(kRequiredCapabilities, "the XDP data plane");
  std::unique_ptr<Dataplane> dataplane(new Dataplane());
  dataplane->skeleton_.reset(xagg_aggregator_bpf__open());
  if (!dataplane->skeleton_) fail("opening the XDP program");
  dataplane->skeleton_->rodata->xagg_udp_port = options.udp_port;
  if (options.result_fan_out)
    dataplane->skeleton_->rodata->xagg_fan_out_cpus =
        static_cast<uint32_t>(std::min(libbpf_num_possible_cpus(), XAGG_MAX_CPUS));
  if (int rc = xagg_aggregator_bpf__load(dataplane->skeleton_.get()); rc < 0) {
    if (-rc == EPERM) throw std::runtime_error("loading the XDP program needs root (or CAP_BPF)");
    fail("loading the XDP program (the verifier log is above)", -rc);
  }
  dataplane->load_unicast_fan_out();
  return dataplane;
}

void Dataplane::load_unicast_fan_out() {
  unicast_.reset(xagg_unicast_bpf__open());
  if (!unicast_) fail("opening the tc unicast fan-out program");
  const std::pair<bpf_map*, bpf_map*> shared[] = {{unicast_->maps.xagg_jobs, skeleton_->maps.xagg_jobs},
                                                  {unicast_->maps.xagg_workers, skeleton_->maps.xagg_workers},
                                                  {unicast_->maps.xagg_stats, skeleton_->maps.xagg_stats}};
  for (auto [own, aggregator] : shared)
    check(bpf_map__reuse_fd(own, bpf_map__fd(aggregator)),
          fmt::format("sharing map {} with the unicast fan-out", bpf_map__name(own)));
  if (int rc = xagg_unicast_bpf__load(unicast_.get()); rc < 0)
    fail("loading the tc unicast fan-out program (the verifier log is above)", -rc);
}

Dataplane::~Dataplane() = default;

int Dataplane::program_fd() const { return bpf_program__fd(skeleton_->progs.xagg_aggregate); }

ProgramRunStats Dataplane::program_run_stats() const {
  bpf_prog_info info{};
  uint32_t length = sizeof(info);
  check(bpf_obj_get_info_by_fd(program_fd(), &info, &length), "reading the XDP program's info");
  return {info.run_time_ns, info.run_cnt};
}

void Dataplane::attach(const std::string& ifname, AttachMode mode) {
  if (attachment_) throw std::logic_error("the aggregator is already attached");
  int ifindex = static_cast<int>(if_nametoindex(ifname.c_str()));
  if (ifindex == 0)
    throw std::runtime_error(fmt::format("interface '{}' does not exist (in this network namespace; use --netns?)",
                                         ifname));
  std::string lock_path;
  UniqueFd lock = lock_interface(ifname, lock_path);
  ensure_bpffs_mounted();
  const std::string dir = pin_dir(ifname);
  if (std::filesystem::exists(dir)) {
    spdlog::warn("removing stale pinned maps in {} (an earlier aggregator did not exit cleanly)", dir);
    detach_leftover_program(ifindex, ifname);
    std::filesystem::remove_all(dir);
  }

  fill_fan_out_maps(ifindex);
  LIBBPF_OPTS(bpf_link_create_opts, link_options, .flags = xdp_mode_flags(mode));
  UniqueFd link(bpf_link_create(program_fd(), ifindex, BPF_XDP, &link_options));
  if (!link) throw std::runtime_error(attach_error(errno, ifname, mode, ifindex));
  attachment_ = std::make_unique<Attachment>();
  attachment_->lock = std::move(lock);
  attachment_->lock_path = std::move(lock_path);
  attachment_->link = std::move(link);
  attachment_->ifname = ifname;
  attachment_->pin_dir = dir;
  attachment_->ifindex = ifindex;
  spdlog::info("attached XDP to {} ({} mode)", ifname, mode == AttachMode::Native ? "native" : "generic");

  // The unicast fan-out, for jobs whose results go by unicast: it acts only on
  // what XDP marked, so it is always there.
  bpf_tc_hook hook = unicast_hook(ifindex);
  int rc = bpf_tc_hook_create(&hook);
  if (rc < 0 && rc != -EEXIST) fail(fmt::format("adding a clsact qdisc to {} for the unicast fan-out", ifname), -rc);
  bpf_tc_opts opts = unicast_filter_opts(bpf_program__fd(unicast_->progs.xagg_unicast_results));
  opts.flags = BPF_TC_F_REPLACE;
  check(bpf_tc_attach(&hook, &opts), fmt::format("attaching the unicast fan-out to {} ingress", ifname));
  attachment_->unicast_filter = true;

  // Only what `xagg stats` reads: a pin outlives a crashed daemon, and a
  // pinned map of cells would keep every job's cells (up to the memory quota).
  create_state_directory(dir);
  for (bpf_map* map : {skeleton_->maps.xagg_jobs, skeleton_->maps.xagg_stats}) {
    std::string path = fmt::format("{}/{}", dir, bpf_map__name(map));
    check(bpf_map__pin(map, path.c_str()), "pinning " + path);
    attachment_->pinned.push_back(path);
  }
}

void Dataplane::fill_fan_out_maps(int ifindex) {
  const uint32_t cpus = skeleton_->rodata->xagg_fan_out_cpus;
  if (cpus == 0) return;
  bpf_devmap_val egress{};
  egress.ifindex = static_cast<uint32_t>(ifindex);
  uint32_t zero = 0;
  check(bpf_map_update_elem(bpf_map__fd(skeleton_->maps.xagg_egress), &zero, &egress, BPF_ANY),
        "setting the result egress");
  bpf_cpumap_val sender{};
  sender.qsize = kFanOutQueueFrames;
  sender.bpf_prog.fd = bpf_program__fd(skeleton_->progs.xagg_send_result);
  bpf_cpumap_val to_stack{};  // no program: the frame goes up the stack on that CPU
  to_stack.qsize = kFanOutQueueFrames;
  for (uint32_t cpu = 0; cpu < cpus; ++cpu) {
    check(bpf_map_update_elem(bpf_map__fd(skeleton_->maps.xagg_result_cpus), &cpu, &sender, BPF_ANY),
          fmt::format("adding CPU {} to the result fan-out", cpu));
    check(bpf_map_update_elem(bpf_map__fd(skeleton_->maps.xagg_pass_cpus), &cpu, &to_stack, BPF_ANY),
          fmt::format("adding CPU {} to the result fan-out to the stack", cpu));
  }
}

std::optional<uint32_t> Dataplane::next_free_slot() const {
  std::vector<bool> used(XAGG_MAX_JOBS);
  for (const auto& [job_id, job] : jobs_) used[job.slot] = true;
  auto free = std::ranges::find(used, false);
  if (free == used.end()) return std::nullopt;
  return static_cast<uint32_t>(free - used.begin());
}

uint32_t Dataplane::add_job(const JobSpec& spec) {
  if (spec.world_size == 0 || spec.world_size > XAGG_MAX_WORKERS)
    throw std::invalid_argument(fmt::format("world size {} is not in 1..{}", spec.world_size, XAGG_MAX_WORKERS));
  // The control plane refuses a shift below ceil(log2 world size), with which
  // a 16-bit sum would not fit 16 bits again (its ranks' own loss).
  if (spec.sum_shift > 6) throw std::invalid_argument(fmt::format("sum shift {} is not in 0..6", spec.sum_shift));
  if (spec.chunks == 0 || spec.chunks > UINT32_MAX / 2)
    throw std::invalid_argument(fmt::format("job {}: {} chunks", spec.job_id, spec.chunks));
  if (jobs_.contains(spec.job_id)) throw std::invalid_argument(fmt::format("job {} exists already", spec.job_id));
  std::optional<uint32_t> slot = next_free_slot();
  if (!slot) throw std::runtime_error(fmt::format("all {} job slots are in use", XAGG_MAX_JOBS));

  const xagg_cell_class cell_class = wire::cell_class_for(spec.chunk_elements);  // throws for a bad chunk size
  LIBBPF_OPTS(bpf_map_create_opts, create, .map_flags = BPF_F_INNER_MAP);
  int cells_fd = bpf_map_create(BPF_MAP_TYPE_ARRAY, "xagg_cells", sizeof(uint32_t),
                                XAGG_CELL_BYTES(wire::cell_capacity(cell_class)), 2 * spec.chunks, &create);
  if (cells_fd < 0)
    fail(fmt::format("allocating {} bytes for job {}", wire::cell_bytes(spec.chunks, spec.chunk_elements),
                     spec.job_id),
         -cells_fd);
  Job& job = jobs_[spec.job_id];
  job.slot = *slot;
  job.cell_class = cell_class;
  job.cells.reset(cells_fd);
  try {
    check(bpf_map_update_elem(cell_map_fd(cell_class), &job.slot, &cells_fd, BPF_ANY),
          "installing the job's chunk array");
    touch_cells(bpf_program__fd(skeleton_->progs.xagg_touch_cells), cell_class, job.slot, 2 * spec.chunks);
    for (const WorkerSpec& worker : spec.workers) {
      if (worker.rank >= spec.world_size)
        throw std::invalid_argument(fmt::format("rank {} is not below world size {}", worker.rank, spec.world_size));
      write_worker(spec.job_id, worker);
    }
    xagg_job entry{};
    entry.token = spec.token;
    entry.full_mask = wire::all_ranks_mask(spec.world_size);
    entry.slot = job.slot;
    entry.num_chunks = spec.chunks;
    entry.result_ip = spec.result_ip.s_addr;
    entry.result_port = htons(spec.result_port);
    entry.result_mode = static_cast<uint8_t>(spec.results);
    entry.world_size = static_cast<uint16_t>(spec.world_size);
    entry.cell_class = cell_class;
    entry.sum_shift = static_cast<uint8_t>(spec.sum_shift);
    if (spec.uplink) {
      const UplinkSpec& up = *spec.uplink;
      entry.has_uplink = 1;
      entry.uplink = {.parent_token = up.parent_token,
                      .parent_ip = up.parent_ip.s_addr,
                      .parent_job_id = htonl(up.parent_job_id),
                      .local_ip = up.local_ip.s_addr,
                      .parent_port = htons(up.parent_port),
                      .parent_rank = htons(static_cast<uint16_t>(up.parent_rank)),
                      .local_mac = {},
                      .next_hop_mac = {},
                      .pad = {}};
      std::ranges::copy(up.local_mac, entry.uplink.local_mac);
      std::ranges::copy(up.next_hop_mac, entry.uplink.next_hop_mac);
      const xagg_parent_key parent{up.parent_ip.s_addr, up.parent_job_id};
      check(bpf_map_update_elem(bpf_map__fd(skeleton_->maps.xagg_parents), &parent, &spec.job_id, BPF_NOEXIST),
            fmt::format("registering job {} as a member of job {} of {}", spec.job_id, up.parent_job_id,
                        to_string(up.parent_ip)));
      job.parent = parent;
    }
    check(bpf_map_update_elem(bpf_map__fd(skeleton_->maps.xagg_jobs), &spec.job_id, &entry, BPF_NOEXIST),
          fmt::format("registering job {}", spec.job_id));
  } catch (...) {
    delete_job_maps(spec.job_id, job);
    jobs_.erase(spec.job_id);
    throw;
  }
  spdlog::debug("job {} in slot {}: {} chunks in cells of {} elements, {} workers", spec.job_id, job.slot, spec.chunks,
                wire::cell_capacity(cell_class), spec.world_size);
  return job.slot;
}

void Dataplane::write_worker(uint32_t job_id, const WorkerSpec& worker) {
  xagg_worker_key key{job_id, worker.rank};
  xagg_worker value{worker.ipv4.s_addr, htons(worker.port), {}};  // XDP learns the next hop
  check(bpf_map_update_elem(bpf_map__fd(skeleton_->maps.xagg_workers), &key, &value, BPF_ANY),
        fmt::format("registering rank {} of job {}", worker.rank, job_id));
  jobs_.at(job_id).ranks.insert(worker.rank);
}

void Dataplane::add_worker(uint32_t job_id, const WorkerSpec& worker) {
  xagg_job entry{};
  if (!jobs_.contains(job_id) ||
      bpf_map_lookup_elem(bpf_map__fd(skeleton_->maps.xagg_jobs), &job_id, &entry) != 0)
    throw std::invalid_argument(fmt::format("job {} does not exist", job_id));
  if (worker.rank >= entry.world_size)
    throw std::invalid_argument(fmt::format("rank {} is not below world size {}", worker.rank, entry.world_size));
  write_worker(job_id, worker);
}

// The job entry goes first: XDP stops using the job before its parts vanish.
void Dataplane::delete_job_maps(uint32_t job_id, const Job& job) {
  bpf_map_delete_elem(bpf_map__fd(skeleton_->maps.xagg_jobs), &job_id);
  if (job.parent) bpf_map_delete_elem(bpf_map__fd(skeleton_->maps.xagg_parents), &*job.parent);
  for (uint32_t rank : job.ranks) {
    xagg_worker_key key{job_id, rank};
    bpf_map_delete_elem(bpf_map__fd(skeleton_->maps.xagg_workers), &key);
  }
  bpf_map_delete_elem(cell_map_fd(job.cell_class), &job.slot);
}

int Dataplane::cell_map_fd(xagg_cell_class cell_class) const {
  switch (cell_class) {
    case XAGG_CELL_CLASS_SMALL: return bpf_map__fd(skeleton_->maps.xagg_cells_small);
    case XAGG_CELL_CLASS_MEDIUM: return bpf_map__fd(skeleton_->maps.xagg_cells_medium);
    case XAGG_CELL_CLASS_LARGE: return bpf_map__fd(skeleton_->maps.xagg_cells_large);
    case XAGG_CELL_CLASS_NARROW_JUMBO: return bpf_map__fd(skeleton_->maps.xagg_cells_narrow_jumbo);
    case XAGG_CELL_CLASSES: break;
  }
  throw std::logic_error(fmt::format("no cell class {}", static_cast<int>(cell_class)));
}

void Dataplane::remove_job(uint32_t job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  delete_job_maps(job_id, it->second);
  clear_counter_row(it->second.slot);
  jobs_.erase(it);  // closes the chunk array; the kernel frees it once XDP is done with it
  spdlog::debug("job {} removed", job_id);
}

CellState Dataplane::cell_state(uint32_t job_id, uint32_t chunk, uint32_t iteration) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) throw std::invalid_argument(fmt::format("job {} does not exist", job_id));
  uint64_t index = uint64_t{chunk} * 2 + (iteration & 1);
  if (index > UINT32_MAX) throw std::runtime_error(fmt::format("job {}: no chunk {}", job_id, chunk));
  auto key = static_cast<uint32_t>(index);
  xagg_chunk cell{};
  check(bpf_map_lookup_elem(it->second.cells.get(), &key, &cell), fmt::format("reading chunk {} of job {}", chunk, job_id));
  return {cell.started != 0, cell.iteration, cell.arrived, cell.total, cell.conflict_total, cell.conflict_rank};
}

void Dataplane::clear_counter_row(uint32_t row) {
  std::vector<uint64_t> zeros(libbpf_num_possible_cpus());
  for (uint32_t counter = 0; counter < XAGG_CNT_COUNT; counter++) {
    uint32_t key = row * XAGG_CNT_COUNT + counter;
    bpf_map_update_elem(bpf_map__fd(skeleton_->maps.xagg_stats), &key, zeros.data(), BPF_ANY);
  }
}

CounterSnapshot Dataplane::counters() const {
  return read_counters(bpf_map__fd(skeleton_->maps.xagg_stats), bpf_map__fd(skeleton_->maps.xagg_jobs));
}

CounterRow Dataplane::job_counters(uint32_t job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return {};
  return read_counter_row(bpf_map__fd(skeleton_->maps.xagg_stats), it->second.slot);
}

CounterRow Dataplane::no_job_counters() const {
  return read_counter_row(bpf_map__fd(skeleton_->maps.xagg_stats), XAGG_STATS_NO_JOB_ROW);
}

}  // namespace xagg::dataplane
