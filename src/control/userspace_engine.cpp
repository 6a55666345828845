// The user-space engine: the XDP program's rules (docs/protocol.md 3.3-3.4)
// over ordinary UDP sockets, as fast as plain sockets allow: recvmmsg and
// sendmmsg in batches, one thread and one SO_REUSEPORT socket per thread (the
// kernel spreads the workers' flows over them), a lock per cell as in XDP.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cell_rules.h"
#include "engine.h"
#include "unique_fd.h"
#include "wire.h"

namespace xagg::control {
namespace {

constexpr size_t kBatch = 64;                 // datagrams per recvmmsg / sendmmsg
constexpr int kSocketBufferBytes = 64 << 20;  // room for bursts of a whole window
using wire::kReceiveSlotBytes;

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(fmt::format("{}: {}", what, std::strerror(errno)));
}

struct Worker {
  bool registered = false;
  in_addr_t ip = 0;  // network order
  in_port_t port = 0;
};

struct Job {
  uint32_t slot = 0;
  uint64_t token = 0;
  uint32_t chunks = 0;
  uint32_t chunk_elements = 0;  // elements per cell: the most a share may have
  CellJob rules;                // what the cell rules need: the full mask, the sum shift
  sockaddr_in broadcast{};
  std::array<Worker, XAGG_MAX_WORKERS> workers{};
  std::unique_ptr<Cell[]> cells;      // 2 per chunk, by iteration parity
  std::unique_ptr<int32_t[]> values;  // chunk_elements per cell, in the cells' order
  std::span<int32_t> values_of(size_t cell) const { return {values.get() + cell * chunk_elements, chunk_elements}; }
};

// Counters of one thread, written by it alone and read by counters().
class ThreadCounters {
 public:
  void add(uint32_t row, xagg_counter counter) {
    auto& cell = cells_[size_t{row} * XAGG_CNT_COUNT + counter];
    cell.store(cell.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  void add_row_to(uint32_t row, dataplane::CounterRow& sums) const {
    for (size_t counter = 0; counter < XAGG_CNT_COUNT; ++counter)
      sums[counter] += cells_[size_t{row} * XAGG_CNT_COUNT + counter].load(std::memory_order_relaxed);
  }
  void clear_row(uint32_t row) {
    for (size_t counter = 0; counter < XAGG_CNT_COUNT; ++counter)
      cells_[size_t{row} * XAGG_CNT_COUNT + counter].store(0, std::memory_order_relaxed);
  }

 private:
  std::array<std::atomic<uint64_t>, XAGG_STATS_ROWS * XAGG_CNT_COUNT> cells_{};
};

// Whether the datagram arrived with CE in its ECN field (IP_RECVTOS).
bool congestion_experienced(msghdr& message) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c))
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS)
      return (*reinterpret_cast<const uint8_t*>(CMSG_DATA(c)) & wire::kEcnMask) == wire::kEcnCe;
  return false;
}

UniqueFd data_socket(uint16_t data_port) {
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) fail("creating a UDP socket");
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
  setsockopt(fd.get(), SOL_SOCKET, SO_BROADCAST, &one, sizeof(one));
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUFFORCE, &kSocketBufferBytes, sizeof(kSocketBufferBytes));
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUFFORCE, &kSocketBufferBytes, sizeof(kSocketBufferBytes));
  // Each datagram's TOS byte, for the CE mark the RESULT echoes.
  if (setsockopt(fd.get(), IPPROTO_IP, IP_RECVTOS, &one, sizeof(one)) != 0) fail("enabling IP_RECVTOS");
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = htonl(INADDR_ANY);
  local.sin_port = htons(data_port);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0)
    fail(fmt::format("binding UDP port {}", data_port));
  return fd;
}

class UserspaceEngine final : public Engine {
 public:
  UserspaceEngine(uint16_t data_port, unsigned threads) : stop_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (!stop_) fail("creating an eventfd");
    counters_ = std::vector<ThreadCounters>(threads);
    std::vector<UniqueFd> sockets;
    for (unsigned i = 0; i < threads; ++i) sockets.push_back(data_socket(data_port));
    for (unsigned i = 0; i < threads; ++i)
      threads_.emplace_back([this, i, fd = std::move(sockets[i])] { serve(fd.get(), counters_[i]); });
    spdlog::info("user-space engine: {} threads on UDP port {}", threads, data_port);
  }

  ~UserspaceEngine() override {
    uint64_t one = 1;
    if (write(stop_.get(), &one, sizeof(one)) != sizeof(one)) spdlog::error("stopping the engine threads failed");
    threads_.clear();  // joins
  }

  std::optional<uint32_t> next_free_slot() const override {
    std::shared_lock lock(jobs_mutex_);
    std::array<bool, XAGG_MAX_JOBS> used{};
    for (const auto& [job_id, job] : jobs_) used[job->slot] = true;
    for (uint32_t slot = 0; slot < XAGG_MAX_JOBS; ++slot)
      if (!used[slot]) return slot;
    return std::nullopt;
  }

  uint32_t add_job(const dataplane::JobSpec& spec) override {
    std::optional<uint32_t> slot = next_free_slot();
    if (!slot) throw std::runtime_error(fmt::format("all {} job slots are in use", XAGG_MAX_JOBS));
    // A baseline for the one-segment case; the other modes are the XDP engine's.
    if (spec.results != wire::ResultMode::Broadcast)
      throw std::runtime_error(
          fmt::format("the userspace engine sends RESULTs by broadcast only, and this job's "
                      "results go by {}",
                      wire::to_string(spec.results)));
    if (spec.uplink)
      throw std::runtime_error("the userspace engine cannot be a leaf of a two-level job (the XDP engine can)");
    auto job = std::make_shared<Job>();
    job->slot = *slot;
    job->token = spec.token;
    job->rules.full_mask = wire::all_ranks_mask(spec.world_size);
    job->chunks = spec.chunks;
    job->rules.sum_shift = spec.sum_shift;
    job->broadcast.sin_family = AF_INET;
    job->broadcast.sin_addr = spec.result_ip;
    job->broadcast.sin_port = htons(spec.result_port);
    // Cells as large as the XDP engine's, whose bytes the registry reserved; throws for a bad chunk size.
    job->chunk_elements = wire::cell_capacity(wire::cell_class_for(spec.chunk_elements));
    job->cells = std::make_unique<Cell[]>(size_t{2} * spec.chunks);
    // Zeroed: first touch now, not on the hot path.
    job->values = std::make_unique<int32_t[]>(size_t{2} * spec.chunks * job->chunk_elements);
    for (const auto& worker : spec.workers) register_worker(*job, worker);
    std::unique_lock lock(jobs_mutex_);
    if (!jobs_.emplace(spec.job_id, std::move(job)).second)
      throw std::runtime_error(fmt::format("job {} exists already", spec.job_id));
    return *slot;
  }

  void add_worker(uint32_t job_id, const dataplane::WorkerSpec& worker) override {
    std::unique_lock lock(jobs_mutex_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) throw std::runtime_error(fmt::format("no job {}", job_id));
    register_worker(*it->second, worker);
  }

  void remove_job(uint32_t job_id) override {
    std::unique_lock lock(jobs_mutex_);  // waits for batches in progress
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    for (auto& counters : counters_) counters.clear_row(it->second->slot);
    jobs_.erase(it);
  }

  dataplane::CounterSnapshot counters() const override {
    dataplane::CounterSnapshot snapshot;
    std::shared_lock lock(jobs_mutex_);
    for (const auto& [job_id, job] : jobs_) {
      dataplane::JobCounters row{job_id, job->slot, {}};
      for (const auto& counters : counters_) counters.add_row_to(job->slot, row.counters);
      snapshot.jobs.push_back(row);
    }
    std::ranges::sort(snapshot.jobs, {}, &dataplane::JobCounters::slot);
    for (const auto& counters : counters_) counters.add_row_to(XAGG_STATS_NO_JOB_ROW, snapshot.no_job);
    return snapshot;
  }

  dataplane::CellState cell_state(uint32_t job_id, uint32_t chunk, uint32_t iteration) const override {
    std::shared_lock lock_jobs(jobs_mutex_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) throw std::invalid_argument(fmt::format("job {} does not exist", job_id));
    const Job& job = *it->second;
    if (chunk >= job.chunks) throw std::runtime_error(fmt::format("job {}: no chunk {}", job_id, chunk));
    Cell& cell = job.cells[size_t{chunk} * 2 + (iteration & 1)];
    if (!lock_cell(cell)) throw std::runtime_error(fmt::format("job {}: chunk {} stayed locked", job_id, chunk));
    dataplane::CellState state{cell.started, cell.iteration,      cell.arrived,
                               cell.total,   cell.conflict_total, cell.conflict_rank};
    unlock_cell(cell);
    return state;
  }

 private:
  static void register_worker(Job& job, const dataplane::WorkerSpec& worker) {
    if (worker.rank >= XAGG_MAX_WORKERS) throw std::runtime_error(fmt::format("rank {} out of range", worker.rank));
    job.workers[worker.rank] = {true, worker.ipv4.s_addr, htons(worker.port)};
  }

  // One thread: receive a batch, merge each packet, send the RESULTs it produced.
  void serve(int fd, ThreadCounters& counters) {
    std::vector<std::byte> buffers(kBatch * kReceiveSlotBytes);
    std::array<sockaddr_in, kBatch> sources{};
    std::array<iovec, kBatch> receive_vectors{};
    std::array<mmsghdr, kBatch> received{};
    std::array<std::array<char, CMSG_SPACE(sizeof(int))>, kBatch> tos_messages{};
    // Up to two RESULT datagrams per DATA (a reduce-scatter chunk's).
    std::array<Reply, 2 * kBatch> replies{};
    std::array<iovec, 2 * kBatch> send_vectors{};
    std::array<mmsghdr, 2 * kBatch> results{};
    std::array<pollfd, 2> waits{pollfd{fd, POLLIN, 0}, pollfd{stop_.get(), POLLIN, 0}};
    while (true) {
      if (poll(waits.data(), waits.size(), -1) < 0 && errno != EINTR) fail("waiting for DATA");
      if (waits[1].revents) return;
      for (size_t i = 0; i < kBatch; ++i) {
        receive_vectors[i] = {buffers.data() + i * kReceiveSlotBytes, kReceiveSlotBytes};
        received[i].msg_hdr = {&sources[i],
                               sizeof(sockaddr_in),
                               &receive_vectors[i],
                               1,
                               tos_messages[i].data(),
                               tos_messages[i].size(),
                               0};
      }
      int count = recvmmsg(fd, received.data(), kBatch, MSG_DONTWAIT, nullptr);
      if (count <= 0) continue;
      size_t replying = 0;
      {
        std::shared_lock lock(jobs_mutex_);
        for (int i = 0; i < count; ++i) {
          auto* packet = static_cast<std::byte*>(receive_vectors[i].iov_base);
          size_t length = received[i].msg_hdr.msg_flags & MSG_TRUNC ? kReceiveSlotBytes : received[i].msg_len;
          const size_t made = handle(packet, length, congestion_experienced(received[i].msg_hdr), sources[i],
                                     std::span<Reply, 2>(replies.data() + replying, 2), counters);
          for (size_t end = replying + made; replying < end; ++replying) {
            send_vectors[replying] = {packet, replies[replying].length};
            results[replying].msg_hdr = {
                &replies[replying].destination, sizeof(sockaddr_in), &send_vectors[replying], 1, nullptr, 0, 0};
          }
        }
      }
      for (size_t sent = 0; sent < replying;) {
        int done = sendmmsg(fd, results.data() + sent, static_cast<unsigned>(replying - sent), 0);
        if (done <= 0) break;  // lost RESULTs are recovered by the workers' resends
        sent += static_cast<size_t>(done);
      }
    }
  }

  // A RESULT to send: the first `length` bytes of the packet.
  struct Reply {
    sockaddr_in destination{};
    size_t length = 0;
  };

  // Applies docs/protocol.md 3.3-3.4 to one datagram, which may become a
  // RESULT; returns how many of `replies` to send it as (0 to 2). A completed
  // reduce-scatter chunk goes whole to its owner and as its header alone to
  // the broadcast address (section 10), which the owner drops.
  size_t handle(std::byte* packet, size_t length, bool congested, const sockaddr_in& source,
                std::span<Reply, 2> replies, ThreadCounters& counters) {
    wire::Decoded decoded = wire::decode_packet({packet, length});
    const uint8_t flags = decoded.header ? decoded.header->flags : 0;
    const bool bad_flags = (flags & ~(wire::kFlagScatter | wire::kFlagOwner | wire::kFlagNarrow)) != 0 ||
                           ((flags & wire::kFlagOwner) != 0 && (flags & wire::kFlagScatter) == 0);
    if (!decoded.header || decoded.header->type != wire::MsgType::Data || bad_flags) {
      bool bad_version = !decoded.header && decoded.error == wire::DecodeError::BadVersion;
      counters.add(XAGG_STATS_NO_JOB_ROW, bad_version ? XAGG_CNT_BAD_VERSION : XAGG_CNT_MALFORMED);
      return false;
    }
    const wire::Header& header = *decoded.header;
    auto it = jobs_.find(header.job_id);
    if (it == jobs_.end()) {
      counters.add(XAGG_STATS_NO_JOB_ROW, XAGG_CNT_UNKNOWN_JOB);
      return false;
    }
    Job& job = *it->second;
    auto reject = [&](xagg_counter counter) {
      counters.add(job.slot, counter);
      return size_t{0};
    };
    if (header.token != job.token) return reject(XAGG_CNT_BAD_TOKEN);
    if (header.rank >= XAGG_MAX_WORKERS || !job.workers[header.rank].registered) return reject(XAGG_CNT_UNKNOWN_WORKER);
    const Worker& worker = job.workers[header.rank];
    if (worker.ip != source.sin_addr.s_addr || worker.port != source.sin_port) return reject(XAGG_CNT_WRONG_SOURCE);
    if (header.chunk >= job.chunks) return reject(XAGG_CNT_OUT_OF_RANGE);

    const size_t cell = size_t{header.chunk} * 2 + (header.iteration & 1);
    CellResult completed;
    Outcome outcome = merge(job.cells[cell], job.values_of(cell), {packet, decoded.elements, decoded.narrow()}, header,
                            job.rules, congested, completed);
    counters.add(job.slot, counter_of(outcome));
    if (outcome != Outcome::Completed && outcome != Outcome::Resend) return 0;
    wire::Header result = header;
    result.type = wire::MsgType::Result;
    result.flags = (outcome == Outcome::Resend ? wire::kFlagResend : 0) | completed.echo |
                   (completed.scatter ? wire::kFlagScatter : 0) | (header.flags & wire::kFlagNarrow);
    if (completed.scatter) result.rank = completed.owner;
    wire::encode_header(result, {packet, wire::kHeaderBytes});
    if (outcome == Outcome::Resend) {
      replies[0] = {source, length};
      return 1;
    }
    if (!completed.scatter) {
      replies[0] = {job.broadcast, length};
      return 1;
    }
    size_t made = 0;
    if (completed.owner < XAGG_MAX_WORKERS && job.workers[completed.owner].registered) {
      const Worker& owner = job.workers[completed.owner];
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = owner.ip;
      address.sin_port = owner.port;
      replies[made++] = {address, length};
    }
    replies[made++] = {job.broadcast, wire::kHeaderBytes};
    counters.add(job.slot, XAGG_CNT_SCATTER_HEADERS);
    return made;
  }

  UniqueFd stop_;
  mutable std::shared_mutex jobs_mutex_;
  std::map<uint32_t, std::shared_ptr<Job>> jobs_;
  std::vector<ThreadCounters> counters_;
  std::vector<std::jthread> threads_;  // last: joined before the state they use goes
};

}  // namespace

std::unique_ptr<Engine> make_userspace_engine(uint16_t data_port, unsigned threads) {
  return std::make_unique<UserspaceEngine>(data_port, std::max(1u, threads));
}

}  // namespace xagg::control
