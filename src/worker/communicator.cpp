#include "xagg/communicator.h"

#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "control_channel.h"
#include "control_waits.h"
#include "failover.h"
#include "inet.h"
#include "join.h"
#include "peer_liveness.h"
#include "pipeline.h"
#include "reductions.h"
#include "shard_placement.h"
#include "udp_transport.h"
#include "wire.h"
#include "xagg/quantize.h"

namespace xagg {

namespace {

constexpr size_t kChunkElems = wire::kChunkElems;
// Ranks of a two-level job: 64 leaves of 64.
constexpr uint32_t kMaxTwoLevelWorld = XAGG_MAX_WORKERS * XAGG_MAX_WORKERS;
// Chunks the job gets beyond max_elements' layout: every all-reduce rounds
// its data and exponent chunks up, so a step of up to kMaxStepBuckets
// buckets totalling max_elements still fits side by side.
constexpr uint64_t kMaxStepBuckets = 32;
constexpr uint64_t kPlacementSlackElements = 2 * kMaxStepBuckets * kChunkElems;
// On the 16-bit wire an exponent chunk carries the block exponents of at
// least this many data chunks (wire::layout_for with blocks, chunks of 300
// lanes and up).
constexpr uint64_t kMinChunksPerExponentChunk = 29;
// Longest join_timeout, operation_timeout and retransmit_interval: far
// beyond any use, and far from overflowing Clock::now() + timeout.
constexpr std::chrono::hours kMaxTimeout{24};
// Largest window_chunks: the window's packet copies (8 KiB each, 512 MiB at
// this limit) are allocated once joined.
constexpr uint32_t kMaxWindowChunks = 65536;
// Bounds of aggregator_dead_after.
constexpr std::chrono::milliseconds kMinDeadAfter{50};
constexpr std::chrono::milliseconds kMaxDeadAfter{60000};
// Longest wait of the progress thread for the survivors' answers to a reshard request.
constexpr std::chrono::milliseconds kFailoverPoll{5};
// Bound on sending Leave when closing.
constexpr std::chrono::milliseconds kLeaveTimeout{1000};
// Longest time an operation reserves before its deadline for asking the
// aggregator who has not contributed (a tenth of the timeout if shorter).
constexpr std::chrono::milliseconds kMaxStatusLead{300};
using worker::JobLevel;
using worker::StartedJob;
using worker::weights_of;

JobLevel leaf_level(CommunicatorConfig config) {
  auto fail = [](const std::string& message) { throw ConfigError("invalid CommunicatorConfig: " + message); };
  const uint32_t rank = config.rank;
  const uint32_t world_size = config.world_size;
  if (config.root_aggregator.empty()) {
    if (config.ranks_per_leaf != 0) fail("ranks_per_leaf is set without a root_aggregator");
    return {std::move(config), std::nullopt, rank, world_size, quant::narrow_sum_shift(world_size, 0)};
  }
  if (config.ranks_per_leaf == 0 || config.ranks_per_leaf > XAGG_MAX_WORKERS)
    fail(fmt::format("ranks_per_leaf {} is not in 1..{}", config.ranks_per_leaf, XAGG_MAX_WORKERS));
  if (world_size == 0 || world_size > kMaxTwoLevelWorld)
    fail(fmt::format("world_size {} of a two-level job is not in 1..{}", world_size, kMaxTwoLevelWorld));
  if (rank >= world_size) fail(fmt::format("rank {} is not below world_size {}", rank, world_size));
  const uint32_t leaves = (world_size + config.ranks_per_leaf - 1) / config.ranks_per_leaf;
  if (leaves > XAGG_MAX_WORKERS)
    fail(fmt::format("{} ranks in leaves of {} make {} leaves, over the {} a root aggregator takes", world_size,
                     config.ranks_per_leaf, leaves, XAGG_MAX_WORKERS));
  if (config.aggregators.size() != leaves)
    fail(fmt::format("{} aggregators for {} leaves ({} ranks in leaves of {}): a two-level job lists one leaf "
                     "aggregator per leaf",
                     config.aggregators.size(), leaves, world_size, config.ranks_per_leaf));
  if (!config.aggregator_weights.empty()) fail("aggregator_weights are for a one-level job");
  if (!parse_endpoint(config.root_aggregator, config.control_port))
    fail(fmt::format("root_aggregator '{}' is not an IPv4 address with an optional :port", config.root_aggregator));
  const uint32_t leaf = rank / config.ranks_per_leaf;
  control::ParentJob parent{config.root_aggregator, leaf, leaves};
  const int sum_shift = quant::narrow_sum_shift(world_size, config.ranks_per_leaf);
  const auto leaf_sum_shift = static_cast<uint32_t>(quant::ceil_log2(config.ranks_per_leaf));
  config.aggregators = {config.aggregators[leaf]};
  config.rank = rank % config.ranks_per_leaf;
  config.world_size = std::min(config.ranks_per_leaf, world_size - leaf * config.ranks_per_leaf);
  config.root_aggregator.clear();
  config.ranks_per_leaf = 0;
  return {std::move(config), std::move(parent), rank, world_size, sum_shift, leaf_sum_shift};
}

// The job's chunks over its aggregators; each must hold at least one.
ShardPlacement placement_for(const CommunicatorConfig& config, uint32_t job_chunks) {
  ShardPlacement placement(weights_of(config), job_chunks);
  for (uint32_t shard = 0; shard < placement.shards(); ++shard)
    if (placement.shard_chunks(shard) == 0)
      throw ConfigError(fmt::format("invalid CommunicatorConfig: aggregator {} ({}) would hold none of the job's {} "
                                    "chunks: raise max_elements or its weight",
                                    shard, config.aggregators[shard], job_chunks));
  return placement;
}

// The aggregators' control endpoints, in the configured order.
std::vector<sockaddr_in> validate(const CommunicatorConfig& config) {
  auto fail = [](const std::string& message) { throw ConfigError("invalid CommunicatorConfig: " + message); };
  if (config.aggregators.empty()) fail("aggregators is empty");
  if (config.aggregators.size() > ShardPlacement::kMaxShards)
    fail(fmt::format("{} aggregators exceed the limit of {}", config.aggregators.size(),
                     ShardPlacement::kMaxShards));
  if (config.control_port == 0) fail("control_port is 0");
  std::vector<sockaddr_in> endpoints;
  for (const std::string& entry : config.aggregators) {
    auto endpoint = parse_endpoint(entry, config.control_port);
    if (!endpoint) fail(fmt::format("aggregator '{}' is not an IPv4 address with an optional :port", entry));
    for (size_t earlier = 0; earlier < endpoints.size(); ++earlier)
      if (endpoints[earlier].sin_addr.s_addr == endpoint->sin_addr.s_addr &&
          endpoints[earlier].sin_port == endpoint->sin_port)
        fail(fmt::format("aggregator '{}' is listed twice (entries {} and {})", entry, earlier, endpoints.size()));
    endpoints.push_back(*endpoint);
  }
  if (!config.aggregator_weights.empty() && config.aggregator_weights.size() != config.aggregators.size())
    fail(fmt::format("{} aggregator_weights for {} aggregators", config.aggregator_weights.size(),
                     config.aggregators.size()));
  if (config.world_size == 0 || config.world_size > XAGG_MAX_WORKERS)
    fail(fmt::format("world_size {} is not in 1..{}", config.world_size, XAGG_MAX_WORKERS));
  if (config.rank >= config.world_size)
    fail(fmt::format("rank {} is not below world_size {}", config.rank, config.world_size));
  if (config.max_elements == 0) fail("max_elements is 0");
  if (config.wire_bits != wire::kWideBits && config.wire_bits != wire::kNarrowBits)
    fail(fmt::format("wire_bits {} is not {} or {}", config.wire_bits, wire::kWideBits, wire::kNarrowBits));
  // Chunk indexes are 32-bit: data chunks plus exponent chunks must fit, however small the job's chunks.
  if (config.max_elements > wire::max_layout_elements(wire::kMinChunkElems) - kPlacementSlackElements)
    fail(fmt::format("max_elements {} needs more than 2^32 chunks", config.max_elements));
  if (config.mtu != 0 && (config.mtu < wire::kMinLinkMtu || config.mtu > UINT16_MAX))
    fail(fmt::format("mtu {} is not in {}..{} (or 0: the path MTU)", config.mtu, wire::kMinLinkMtu, UINT16_MAX));
  auto check_timeout = [&](std::chrono::milliseconds timeout, const char* name) {
    if (timeout.count() <= 0) fail(fmt::format("{} is not positive", name));
    if (timeout > kMaxTimeout)
      fail(fmt::format("{} of {} ms exceeds the limit of {} ms (24 hours)", name, timeout.count(),
                       std::chrono::milliseconds{kMaxTimeout}.count()));
  };
  check_timeout(config.join_timeout, "join_timeout");
  check_timeout(config.operation_timeout, "operation_timeout");
  check_timeout(config.retransmit_interval, "retransmit_interval");
  if (config.aggregator_dead_after < kMinDeadAfter || config.aggregator_dead_after > kMaxDeadAfter)
    fail(fmt::format("aggregator_dead_after of {} ms is not in {}..{} ms", config.aggregator_dead_after.count(),
                     kMinDeadAfter.count(), kMaxDeadAfter.count()));
  if (config.window_chunks == 0) fail("window_chunks is 0");
  // Every aggregator must hold a chunk even with the largest chunks, the fewest.
  (void)placement_for(config, wire::layout_for(config.max_elements + kPlacementSlackElements, kChunkElems).total());
  if (config.window_chunks > kMaxWindowChunks)
    fail(fmt::format("window_chunks {} exceeds the limit of {}", config.window_chunks, kMaxWindowChunks));
  return endpoints;
}

// What the job asks of its aggregators: max_elements, the placement slack
// and, on the 16-bit wire, room for the block exponents (an exponent chunk
// covers at least kMinChunksPerExponentChunk data chunks then).
uint64_t job_elements(const CommunicatorConfig& config) {
  if (config.wire_bits != wire::kNarrowBits) return config.max_elements + kPlacementSlackElements;
  return config.max_elements + config.max_elements / kMinChunksPerExponentChunk + 2 * kPlacementSlackElements;
}

// The job's longest packet: a whole chunk in its width.
size_t job_packet_bytes(const CommunicatorConfig& config, const control::Start& start) {
  return wire::packet_bytes(start.chunk_elements, config.wire_bits == wire::kNarrowBits);
}

// window_chunks counts chunks of the largest size: a job with smaller
// chunks (a smaller MTU) holds the same bytes in flight in more of them.
uint32_t window_for_job(const CommunicatorConfig& config, const control::Start& start) {
  const uint64_t chunks =
      (uint64_t{config.window_chunks} * kChunkElems + start.chunk_elements - 1) / start.chunk_elements;
  return static_cast<uint32_t>(chunks);
}

// Room for a whole window of results arriving at once.
size_t socket_buffer_bytes(const CommunicatorConfig& config, const control::Start& start) {
  constexpr size_t kMinimum = 4u << 20;
  return std::max(kMinimum, size_t{window_for_job(config, start)} * (job_packet_bytes(config, start) + 512));
}

std::vector<worker::UdpTransport::Aggregator> transport_aggregators(const CommunicatorConfig& config,
                                                                    const StartedJob& job) {
  std::vector<worker::UdpTransport::Aggregator> aggregators;
  for (uint32_t shard = 0; shard < job.aggregators.size(); ++shard) {
    const worker::JoinedAggregator& joined = job.aggregators[shard];
    sockaddr_in data = joined.endpoint;
    data.sin_port = htons(joined.reply.data_port);
    aggregators.push_back({config.aggregators[shard], data, joined.reply.result_port, joined.group});
  }
  return aggregators;
}

worker::PipelineSettings pipeline_settings(const JobLevel& level, const StartedJob& job) {
  const CommunicatorConfig& config = level.config;
  return {config.job_id,
          job.tokens(),
          static_cast<uint16_t>(config.rank),
          window_for_job(config, job.start),
          config.retransmit_interval,
          std::min(kMaxStatusLead, config.operation_timeout / 10),
          worker::progress_interval(config.operation_timeout),
          (job_packet_bytes(config, job.start) + 63) / 64 * 64,
          wire::layout_for(0, job.start.chunk_elements, true).blocks_per_chunk,
          job.aggregators.size() > 1,
          level.parent ? level.parent->aggregator : std::string{}};
}

// The error reported by the aggregator (or by a failed control connection);
// once set, every pending and later operation fails with it.
class FailureState {
 public:
  void set(std::string message) {
    std::lock_guard lock(mutex_);
    if (!message_) message_ = std::move(message);
    failed_.store(true, std::memory_order_release);
  }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  void throw_if_failed() const {
    if (!failed_.load(std::memory_order_acquire)) return;
    std::lock_guard lock(mutex_);
    throw CommError(*message_);
  }

 private:
  mutable std::mutex mutex_;
  std::optional<std::string> message_;
  std::atomic<bool> failed_{false};
};

class OperationWork final : public Work {
 public:
  OperationWork() = default;
  // Holds memory the operation reads and writes (a reduce-scatter's copies of the shards) until it is done.
  explicit OperationWork(std::shared_ptr<const void> buffer) : buffer_(std::move(buffer)) {}
  bool completed() const override {
    std::lock_guard lock(mutex_);
    return done_;
  }
  void wait() override {
    std::unique_lock lock(mutex_);
    done_changed_.wait(lock, [this] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  void finish(std::exception_ptr error) {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
      error_ = std::move(error);
    }
    done_changed_.notify_all();
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable done_changed_;
  bool done_ = false;
  std::exception_ptr error_;
  std::shared_ptr<const void> buffer_;
};

// The Works of several operations as one: done when all are, failing with the first error.
class WorksTogether final : public Work {
 public:
  explicit WorksTogether(std::vector<std::shared_ptr<Work>> works) : works_(std::move(works)) {}
  bool completed() const override {
    return std::ranges::all_of(works_, [](const auto& work) { return work->completed(); });
  }
  void wait() override {
    std::exception_ptr first_error;
    for (auto& work : works_) {
      try {
        work->wait();
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
    }
    if (first_error) std::rethrow_exception(first_error);
  }

 private:
  std::vector<std::shared_ptr<Work>> works_;
};

// Status requests go out on the progress thread; the aggregators' monitor
// threads, which read the control connections, post the replies here. Nobody
// waits on it: an answer that misses the deadline is reported as unknown. An
// aggregator answers a connection's requests in order, so replies are matched
// to the questions in order: several all-reduces of one step share a tag.
class StatusMailbox final : public worker::ContributionStatus {
 public:
  StatusMailbox(std::vector<std::unique_ptr<ControlChannel>>& controls, uint32_t job_id, uint32_t rank)
      : controls_(controls), pending_(controls.size()), job_id_(job_id), rank_(rank) {}

  uint64_t ask(uint32_t shard, uint32_t tag, std::span<const uint32_t> chunks, Clock::time_point deadline) override {
    uint64_t question = 0;
    {
      std::lock_guard lock(mutex_);
      question = next_question_++;
      pending_[shard].push_back({question, tag});
    }
    try {
      controls_[shard]->send(control::StatusRequest{tag, {chunks.begin(), chunks.end()}}, deadline);
    } catch (const CommError& error) {
      spdlog::debug("xagg: job {} rank {}: status request not sent: {}", job_id_, rank_, error.what());
      std::lock_guard lock(mutex_);
      std::erase_if(pending_[shard], [&](const Pending& pending) { return pending.question == question; });
    }
    return question;
  }

  std::optional<control::StatusReply> answer(uint64_t question) const override {
    std::lock_guard lock(mutex_);
    auto found = answers_.find(question);
    if (found == answers_.end()) return std::nullopt;
    return found->second;
  }

  void post(uint32_t shard, control::StatusReply reply) {
    std::lock_guard lock(mutex_);
    if (pending_[shard].empty()) return;
    Pending oldest = pending_[shard].front();
    pending_[shard].pop_front();
    if (reply.iteration == oldest.tag) answers_[oldest.question] = std::move(reply);
  }

 private:
  struct Pending {
    uint64_t question;
    uint32_t tag;
  };
  std::vector<std::unique_ptr<ControlChannel>>& controls_;
  mutable std::mutex mutex_;
  uint64_t next_question_ = 0;
  std::vector<std::deque<Pending>> pending_;  // per aggregator
  std::map<uint64_t, control::StatusReply> answers_;
  uint32_t job_id_;
  uint32_t rank_;
};

}  // namespace

class Communicator::Impl {
 public:
  // Joins the job; then the communicator runs it.
  static std::unique_ptr<Impl> join(CommunicatorConfig config) {
    const JobLevel level = leaf_level(std::move(config));
    const std::vector<sockaddr_in> endpoints = validate(level.config);
    StartedJob job = worker::join_job(level, endpoints, job_elements(level.config));
    ShardPlacement placement =
        placement_for(level.config, wire::layout_for(job_elements(level.config), job.start.chunk_elements).total());
    return std::make_unique<Impl>(level, std::move(job), std::move(placement));
  }

  // The initializers read the arguments, not earlier members, but for the
  // objects that later ones are built on (the connections and the transport).
  // `placement`: the job's chunks over the aggregators, in the chunk size they started it with.
  Impl(const JobLevel& level, StartedJob job, ShardPlacement placement)
      : rank_(level.rank),
        world_size_(level.world_size),
        sum_shift_(level.sum_shift),
        parent_(level.parent),
        config_(level.config),
        controls_(std::move(job.controls)),
        start_(job.start),
        placement_(placement),
        transport_(transport_aggregators(level.config, job), socket_buffer_bytes(level.config, job.start)),
        status_mailbox_(controls_, level.config.job_id, level.config.rank),
        pipeline_(transport_, placement, pipeline_settings(level, job), status_mailbox_),
        wake_(make_wake_fd()),
        failover_({level.config.job_id, level.config.rank, level.config.aggregators, weights_of(level.config),
                   placement.job_chunks(), level.config.operation_timeout},
                  job.tokens()) {
    for (uint32_t shard = 0; shard < job.aggregators.size(); ++shard)
      if (job.aggregators[shard].chunks != placement_.shard_chunks(shard))
        throw CommError(fmt::format(
            "job {} rank {}: aggregator {} holds {} chunks, but the job's layout places {} there", config_.job_id,
            config_.rank, config_.aggregators[shard], job.aggregators[shard].chunks, placement_.shard_chunks(shard)));
    for (uint32_t shard = 0; shard < controls_.size(); ++shard)
      monitors_.emplace_back([this, shard](std::stop_token stop) { monitor_control(stop, shard); });
    progress_ = std::jthread([this] { run_operations(); });
    const control::JoinReply& first = job.aggregators[0].reply;
    spdlog::info("xagg: job {} rank {}/{} joined {}{} (data port {}, result port {}{}; MTU {}, {} elements per chunk)",
                 config_.job_id, rank_, world_size_,
                 parent_ ? fmt::format("as rank {}/{} of leaf {} of {} under root {}, on ", config_.rank,
                                       config_.world_size, parent_->leaf, parent_->leaves, parent_->aggregator)
                         : std::string{},
                 controls_.size() == 1 ? fmt::format("aggregator {}", config_.aggregators[0])
                                       : fmt::format("{} aggregators", controls_.size()),
                 first.data_port, first.result_port, controls_.size() == 1 ? "" : " at the first", start_.mtu,
                 start_.chunk_elements);
  }

  ~Impl() {
    // Queued operations still run: other ranks need this rank's data, and
    // each is bounded by operation_timeout (or fails at once after an error).
    {
      std::lock_guard lock(queue_mutex_);
      closing_ = true;
    }
    queue_changed_.notify_all();
    progress_.join();
    for (std::jthread& monitor : monitors_) monitor.request_stop();
    monitors_.clear();  // joins them
    for (uint32_t shard = 0; shard < controls_.size(); ++shard) {
      if (failover_.is_dead(shard)) continue;
      try {
        controls_[shard]->send(control::Leave{}, Clock::now() + kLeaveTimeout);
      } catch (const CommError& error) {
        spdlog::debug("xagg: job {} rank {}: leave not sent to aggregator {}: {}", config_.job_id, config_.rank,
                      config_.aggregators[shard], error.what());
      }
    }
  }

  const CommunicatorConfig& config() const { return config_; }
  // The whole job's, which a two-level job's config_ (its leaf's) is not.
  uint32_t rank() const { return rank_; }
  uint32_t world_size() const { return world_size_; }

  // The largest all-reduce of this width (narrow: 16-bit lanes) that the
  // job's chunks hold: max_elements, but as 32 bits on a 16-bit job half of
  // it, and as 16 bits on a 32-bit job what its block exponents leave.
  uint64_t max_allreduce_elements(bool narrow) const {
    const uint32_t chunk_elements = operation_chunk_elements(narrow);
    uint64_t most = config_.max_elements * chunk_elements / start_.chunk_elements;
    uint64_t fits = 0;  // the largest count whose layout fits, by bisection
    for (uint64_t step = uint64_t{1} << 40; step > 0; step /= 2)
      if (fits + step <= most &&
          wire::layout_for(fits + step, chunk_elements, narrow).total() <= placement_.job_chunks())
        fits += step;
    return fits;
  }
  const control::Start& start() const { return start_; }
  void throw_if_failed() const { failure_.throw_if_failed(); }

  template <class T>
  std::shared_ptr<Work> enqueue(T* data, size_t count, ReduceOp op, uint32_t wire_bits,
                                worker::ScatterRole role = worker::ScatterRole::None,
                                std::shared_ptr<const void> buffer = nullptr) {
    const bool narrow = narrow_operation<T>(wire_bits);
    const uint32_t chunk_elements = operation_chunk_elements(narrow);
    check_operation("allreduce", count, data != nullptr, narrow);
    auto work = std::make_shared<OperationWork>(std::move(buffer));
    std::unique_ptr<worker::Reduction> reduction;
    if constexpr (std::is_same_v<T, float>)
      reduction = std::make_unique<worker::Float32Reduction>(data, count, op, world_size_, chunk_elements, role,
                                                             worker::Lanes{narrow, sum_shift_});
    else
      reduction = std::make_unique<worker::Int32Reduction>(data, count, op, world_size_, chunk_elements, role);
    push({std::move(reduction), work});
    return work;
  }

  // One operation per shard, each owned by its rank (docs/protocol.md section 10):
  // this rank's own shard is reduced in output, the others in copies that it
  // sends and whose values it never receives.
  template <class T>
  std::shared_ptr<Work> enqueue_reduce_scatter(const std::vector<const T*>& shards, T* output, size_t count,
                                               ReduceOp op, uint32_t wire_bits) {
    if (shards.size() != world_size_)
      throw ConfigError(fmt::format("reduce_scatter needs one shard per rank ({}), got {}", world_size_, shards.size()));
    check_operation("reduce_scatter", count,
                    output != nullptr && std::ranges::none_of(shards, [](const T* shard) { return shard == nullptr; }),
                    narrow_operation<T>(wire_bits));
    std::vector<std::shared_ptr<Work>> works;
    for (uint32_t owner = 0; owner < world_size_; ++owner) {
      if (owner == rank_) {
        std::copy_n(shards[owner], count, output);
        works.push_back(enqueue(output, count, op, wire_bits, worker::ScatterRole::Owner));
      } else {
        auto copy = std::make_shared<std::vector<T>>(shards[owner], shards[owner] + count);
        works.push_back(enqueue(copy->data(), count, op, wire_bits, worker::ScatterRole::Other, copy));
      }
    }
    return std::make_shared<WorksTogether>(std::move(works));
  }

  // Whether an operation goes as 16-bit lanes (docs/protocol.md section 11):
  // float32 at the width asked (0: the job's); int32 always as int32.
  template <class T>
  bool narrow_operation(uint32_t wire_bits) const {
    if (wire_bits == 0) wire_bits = std::is_same_v<T, float> ? config_.wire_bits : wire::kWideBits;
    if (wire_bits != wire::kWideBits && wire_bits != wire::kNarrowBits)
      throw ConfigError(fmt::format("wire_bits {} is not {} or {}", wire_bits, wire::kWideBits, wire::kNarrowBits));
    if (!std::is_same_v<T, float> && wire_bits == wire::kNarrowBits)
      throw ConfigError(fmt::format("job {}: an int32 all-reduce cannot go over the 16-bit wire exactly; it goes as "
                                    "32 bits on any communicator",
                                    config_.job_id));
    const bool narrow = wire_bits == wire::kNarrowBits;
    // A leaf that is smaller than the others sums on another scale unless the
    // job's joins fixed the shift (section 11, item 6).
    if (narrow && parent_ && config_.wire_bits != wire::kNarrowBits)
      throw ConfigError(fmt::format("job {}: a 16-bit all-reduce of a two-level job needs a communicator with "
                                    "wire_bits 16 (its leaves then sum on one scale)",
                                    config_.job_id));
    return narrow;
  }

  // A chunk holds the job's chunk_elements of its own width, or of int32 on a
  // 16-bit job (whose cells are sized for 16-bit lanes), so narrow lanes on a
  // 32-bit job fill half a packet.
  uint32_t operation_chunk_elements(bool narrow) const {
    return narrow ? start_.chunk_elements : wire::chunk_elements_for(start_.mtu, wire::kWideBits);
  }

  void begin_step() { push({}); }

 private:
  void check_operation(const char* name, size_t count, bool buffers_given, bool narrow) const {
    const uint64_t most = max_allreduce_elements(narrow);
    if (count > most)
      throw ConfigError(most == config_.max_elements
                            ? fmt::format("{} of {} elements exceeds max_elements {}", name, count, most)
                            : fmt::format("{} of {} elements as {} bits on a {}-bit communicator exceeds the {} its "
                                          "chunks hold (max_elements {}; Communicator::max_allreduce_elements)",
                                          name, count, narrow ? 16 : 32, config_.wire_bits, most,
                                          config_.max_elements));
    if (!buffers_given && count > 0) throw ConfigError(fmt::format("{} of a null buffer", name));
  }

  struct Operation {
    std::unique_ptr<worker::Reduction> reduction;
    std::shared_ptr<OperationWork> work;
  };

  // An operation, or (without a reduction) the start of a step.
  void push(Operation operation) {
    {
      std::lock_guard lock(queue_mutex_);
      queue_.push_back(std::move(operation));
    }
    wake_progress();
  }

  // Wakes the progress thread whether it waits for operations or for results.
  void wake_progress() {
    queue_changed_.notify_all();
    uint64_t one = 1;
    // Only fails when the counter would overflow, which means the thread is awake anyway.
    [[maybe_unused]] ssize_t written = ::write(wake_.get(), &one, sizeof(one));
  }

  static UniqueFd make_wake_fd() {
    UniqueFd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!fd) throw CommError(fmt::format("eventfd: {}", std::strerror(errno)));
    return fd;
  }

  // Reads the aggregator's control connection and sends it heartbeats: a
  // closed connection, or a silence that TCP's loss repair does not excuse
  // (peer_liveness.h), means it is dead.
  void monitor_control(std::stop_token stop, uint32_t shard) {
    const std::string& aggregator = config_.aggregators[shard];
    try {
      Heartbeat heartbeat(*controls_[shard], config_.aggregator_dead_after);
      while (!stop.stop_requested()) {
        // Counted dead on another rank's word: what it says from now on (an
        // error once a rank leaves it) concerns an epoch this rank has left.
        if (is_dead(shard)) return;
        if (auto death = heartbeat.check()) return lose_aggregator(shard, *death);
        auto message = controls_[shard]->receive(std::min(Clock::now() + worker::kControlPoll, heartbeat.next_ping()));
        if (!message) continue;
        heartbeat.heard();
        if (auto* error = std::get_if<control::Error>(&*message)) {
          if (is_dead(shard)) return;
          spdlog::error("xagg: job {} rank {}: aggregator {} reported: {}", config_.job_id, config_.rank, aggregator,
                        error->message);
          failure_.set(controls_.size() == 1 ? error->message
                                             : fmt::format("aggregator {}: {}", aggregator, error->message));
          wake_progress();
          return;
        }
        if (auto* status = std::get_if<control::StatusReply>(&*message))
          status_mailbox_.post(shard, std::move(*status));
        if (auto* notice = std::get_if<control::ReshardRequest>(&*message))
          change_failover([&](worker::Failover& failover) { failover.learn_failures(shard, *notice); });
        if (auto* resharded = std::get_if<control::Resharded>(&*message))
          change_failover([&](worker::Failover& failover) { failover.take_resharded(shard, *resharded); });
      }
    } catch (const CommError& error) {
      lose_aggregator(shard, error.what());
    }
  }

  // Failover (docs/protocol.md section 8): the monitors tell failover_ what
  // they learn, and the progress thread takes its steps, under queue_mutex_.
  bool failover_pending() const { return failover_.pending() && !failure_.failed(); }

  bool is_dead(uint32_t shard) {
    std::lock_guard lock(queue_mutex_);
    return failover_.is_dead(shard);
  }

  template <class Change>
  void change_failover(Change change) {
    {
      std::lock_guard lock(queue_mutex_);
      change(failover_);
    }
    wake_progress();
  }

  void lose_aggregator(uint32_t shard, const std::string& cause) {
    change_failover([&](worker::Failover& failover) { failover.mark_dead(shard, cause); });
  }

  // Called by the progress thread with the lock held; requests go out without it.
  void drive_failover(std::unique_lock<std::mutex>& lock) {
    worker::Failover::Step step = failover_.next_step();
    if (auto* fail = std::get_if<worker::Failover::Fail>(&step)) return failure_.set(std::move(fail->message));
    if (std::holds_alternative<worker::Failover::AwaitAnswers>(step)) {
      queue_changed_.wait_for(lock, kFailoverPoll);
      return;
    }
    if (auto* send = std::get_if<worker::Failover::SendRequests>(&step)) {
      lock.unlock();
      for (const auto& [aggregator, request] : send->requests) {
        try {
          controls_[aggregator]->send(request, send->deadline);
        } catch (const CommError& error) {
          // Its monitor finds the connection dead too, and the epoch moves on.
          spdlog::warn("xagg: job {} rank {}: reshard request not sent to aggregator {}: {}", config_.job_id,
                       config_.rank, config_.aggregators[aggregator], error.what());
        }
      }
      lock.lock();
      return;
    }
    auto& move = std::get<worker::Failover::MoveChunks>(step);
    pipeline_.move_to(std::move(move.placement), std::move(move.survivors), std::move(move.tokens),
                      move.courtesy_until);
    failover_.moved();
  }

  // Starts queued operations in call order as far as the pipeline has room,
  // and drives the pipeline while anything runs.
  void run_operations() {
    for (;;) {
      {
        std::unique_lock lock(queue_mutex_);
        if (pipeline_.idle() && !failover_pending())
          queue_changed_.wait(lock, [this] { return closing_ || !queue_.empty() || failover_pending(); });
        if (closing_ && pipeline_.idle() && queue_.empty()) return;  // everything done
        uint64_t wakeups;
        [[maybe_unused]] ssize_t drained = ::read(wake_.get(), &wakeups, sizeof(wakeups));
        // Nothing goes out until the survivors hold the job's chunks.
        if (failover_pending()) {
          drive_failover(lock);
          continue;
        }
        while (!queue_.empty()) {
          Operation& next = queue_.front();
          if (!next.reduction) {
            pipeline_.restart_placement();
            queue_.pop_front();
            continue;
          }
          started_.push_back({next.work, false, nullptr});
          uint64_t sequence = first_unfinished_ + started_.size() - 1;
          if (!pipeline_.try_start(next.reduction, sequence, Clock::now() + config_.operation_timeout,
                                   [this, sequence](std::exception_ptr error) {
                                     if (error) give_up_job(sequence, error);
                                     finish_in_order(sequence, error);
                                   })) {
            started_.pop_back();
            break;
          }
          queue_.pop_front();
        }
      }
      try {
        failure_.throw_if_failed();
        pipeline_.progress(wake_.get());
      } catch (...) {
        pipeline_.fail_all(std::current_exception());
      }
    }
  }

  // An operation that failed on this rank may have ended elsewhere, with
  // results this rank never consumed: chunk tags (a redone chunk) and
  // remembered exponents may differ between ranks from now on, which could
  // hang or silently corrupt later operations. So later ones fail.
  void give_up_job(uint64_t sequence, std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& failed) {
      failure_.set(fmt::format("job {} rank {}: the job is unusable since operation {} failed: {}", config_.job_id,
                               config_.rank, sequence, failed.what()));
    }
  }

  // Operations may end out of order (those whose buffers overlap never run
  // at once: Pipeline::try_start); their Works complete in call order, so a
  // completed Work means every earlier one has completed too.
  void finish_in_order(uint64_t sequence, std::exception_ptr error) {
    Started& started = started_[sequence - first_unfinished_];
    started.ended = true;
    started.error = std::move(error);
    for (; !started_.empty() && started_.front().ended; ++first_unfinished_) {
      started_.front().work->finish(started_.front().error);
      started_.pop_front();
    }
  }

  const uint32_t rank_;
  const uint32_t world_size_;
  const int sum_shift_;                             // of the job's 16-bit SUM results
  const std::optional<control::ParentJob> parent_;  // a two-level job: its leaf aggregator's parent
  CommunicatorConfig config_;  // a two-level job: its leaf's job, where ranks and world are the leaf's
  std::vector<std::unique_ptr<ControlChannel>> controls_;  // one per aggregator
  control::Start start_;  // the job's MTU, chunk size and width, alike from every aggregator
  ShardPlacement placement_;
  worker::UdpTransport transport_;
  FailureState failure_;
  StatusMailbox status_mailbox_;
  worker::Pipeline pipeline_;
  UniqueFd wake_;  // eventfd: an operation was queued

  // Used by the progress thread only: operations started and not yet
  // completed, in call order; the first has sequence number first_unfinished_.
  struct Started {
    std::shared_ptr<OperationWork> work;
    bool ended = false;
    std::exception_ptr error;
  };
  std::deque<Started> started_;
  uint64_t first_unfinished_ = 0;

  std::mutex queue_mutex_;
  std::condition_variable queue_changed_;
  std::deque<Operation> queue_;
  bool closing_ = false;

  worker::Failover failover_;  // guarded by queue_mutex_

  std::vector<std::jthread> monitors_;  // one per aggregator's control connection
  std::jthread progress_;
};

Communicator::Communicator(CommunicatorConfig config) : impl_(Impl::join(std::move(config))) {}

Communicator::~Communicator() = default;

void Communicator::allreduce(float* data, size_t count, ReduceOp op, uint32_t wire_bits) {
  allreduce_async(data, count, op, wire_bits)->wait();
}

void Communicator::allreduce(int32_t* data, size_t count, ReduceOp op) { allreduce_async(data, count, op)->wait(); }

std::shared_ptr<Work> Communicator::allreduce_async(float* data, size_t count, ReduceOp op, uint32_t wire_bits) {
  return impl_->enqueue(data, count, op, wire_bits);
}

std::shared_ptr<Work> Communicator::allreduce_async(int32_t* data, size_t count, ReduceOp op) {
  return impl_->enqueue(data, count, op, wire::kWideBits);
}

std::shared_ptr<Work> Communicator::reduce_scatter_async(const std::vector<const float*>& shards, float* output,
                                                         size_t count, ReduceOp op, uint32_t wire_bits) {
  return impl_->enqueue_reduce_scatter(shards, output, count, op, wire_bits);
}

std::shared_ptr<Work> Communicator::reduce_scatter_async(const std::vector<const int32_t*>& shards, int32_t* output,
                                                         size_t count, ReduceOp op) {
  return impl_->enqueue_reduce_scatter(shards, output, count, op, wire::kWideBits);
}

void Communicator::begin_step() { impl_->begin_step(); }

void Communicator::throw_if_failed() const { impl_->throw_if_failed(); }

uint32_t Communicator::rank() const { return impl_->rank(); }

uint32_t Communicator::world_size() const { return impl_->world_size(); }

uint32_t Communicator::mtu() const { return impl_->start().mtu; }

uint32_t Communicator::chunk_elements() const { return impl_->start().chunk_elements; }
uint32_t Communicator::wire_bits() const { return impl_->start().wire_bits; }

uint64_t Communicator::max_allreduce_elements(uint32_t wire_bits) const {
  return impl_->max_allreduce_elements(impl_->narrow_operation<float>(wire_bits));
}

}  // namespace xagg
