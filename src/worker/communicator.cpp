#include "xagg/communicator.h"

#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <unistd.h>

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
#include "pipeline.h"
#include "reductions.h"
#include "udp_transport.h"
#include "wire.h"

namespace xagg {

using worker::Clock;

namespace {

constexpr size_t kChunkElems = wire::kChunkElems;
// Chunks the job gets beyond max_elements' layout: every all-reduce rounds
// its data and exponent chunks up, so a step of up to kMaxStepBuckets
// buckets totalling max_elements still fits side by side.
constexpr uint64_t kMaxStepBuckets = 32;
constexpr uint64_t kPlacementSlackElements = 2 * kMaxStepBuckets * kChunkElems;
// Longest join_timeout, operation_timeout and retransmit_interval: far
// beyond any use, and far from overflowing Clock::now() + timeout.
constexpr std::chrono::hours kMaxTimeout{24};
// Largest window_chunks: the window's packet copies (8 KiB each, 512 MiB at
// this limit) are allocated once joined.
constexpr uint32_t kMaxWindowChunks = 65536;
// Shortest wait of the control monitor, so that closing is prompt.
constexpr std::chrono::milliseconds kMonitorPoll{50};
// Bound on sending Leave when closing.
constexpr std::chrono::milliseconds kLeaveTimeout{1000};
// Longest time an operation reserves before its deadline for asking the
// aggregator who has not contributed (a tenth of the timeout if shorter).
constexpr std::chrono::milliseconds kMaxStatusLead{300};

sockaddr_in validate(const CommunicatorConfig& config) {
  auto fail = [](const std::string& message) { throw ConfigError("invalid CommunicatorConfig: " + message); };
  if (config.aggregator.empty()) fail("aggregator is empty");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(config.control_port);
  if (::inet_pton(AF_INET, config.aggregator.c_str(), &address.sin_addr) != 1)
    fail(fmt::format("aggregator '{}' is not an IPv4 address", config.aggregator));
  if (config.control_port == 0) fail("control_port is 0");
  if (config.world_size == 0 || config.world_size > XAGG_MAX_WORKERS)
    fail(fmt::format("world_size {} is not in 1..{}", config.world_size, XAGG_MAX_WORKERS));
  if (config.rank >= config.world_size)
    fail(fmt::format("rank {} is not below world_size {}", config.rank, config.world_size));
  if (config.max_elements == 0) fail("max_elements is 0");
  // Chunk indexes are 32-bit: data chunks plus exponent chunks must fit.
  uint64_t elements = config.max_elements + kPlacementSlackElements;
  uint64_t data_chunks = elements / kChunkElems + (elements % kChunkElems != 0);
  if (elements < config.max_elements || data_chunks + (data_chunks + kChunkElems - 1) / kChunkElems > UINT32_MAX)
    fail(fmt::format("max_elements {} needs more than 2^32 chunks", config.max_elements));
  auto check_timeout = [&](std::chrono::milliseconds timeout, const char* name) {
    if (timeout.count() <= 0) fail(fmt::format("{} is not positive", name));
    if (timeout > kMaxTimeout)
      fail(fmt::format("{} of {} ms exceeds the limit of {} ms (24 hours)", name, timeout.count(),
                       std::chrono::milliseconds{kMaxTimeout}.count()));
  };
  check_timeout(config.join_timeout, "join_timeout");
  check_timeout(config.operation_timeout, "operation_timeout");
  check_timeout(config.retransmit_interval, "retransmit_interval");
  if (config.window_chunks == 0) fail("window_chunks is 0");
  if (config.window_chunks > kMaxWindowChunks)
    fail(fmt::format("window_chunks {} exceeds the limit of {}", config.window_chunks, kMaxWindowChunks));
  return address;
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
};

// Status requests go out on the progress thread; the monitor thread, which
// reads the control connection, posts the replies here. Nobody waits on it:
// an answer that misses the deadline is reported as unknown. The aggregator
// answers a connection's requests in order, so replies are matched to the
// questions in order: several all-reduces of one step share a tag.
class StatusMailbox final : public worker::ContributionStatus {
 public:
  StatusMailbox(worker::ControlChannel& control, uint32_t job_id, uint32_t rank)
      : control_(control), job_id_(job_id), rank_(rank) {}

  uint64_t ask(uint32_t tag, std::span<const uint32_t> chunks, Clock::time_point deadline) override {
    uint64_t question = 0;
    {
      std::lock_guard lock(mutex_);
      question = next_question_++;
      pending_.push_back({question, tag});
    }
    try {
      control_.send(control::StatusRequest{tag, {chunks.begin(), chunks.end()}}, deadline);
    } catch (const CommError& error) {
      spdlog::debug("xagg: job {} rank {}: status request not sent: {}", job_id_, rank_, error.what());
      std::lock_guard lock(mutex_);
      std::erase_if(pending_, [&](const Pending& pending) { return pending.question == question; });
    }
    return question;
  }

  std::optional<std::vector<uint32_t>> answer(uint64_t question) const override {
    std::lock_guard lock(mutex_);
    auto found = answers_.find(question);
    if (found == answers_.end()) return std::nullopt;
    return found->second;
  }

  void post(control::StatusReply reply) {
    std::lock_guard lock(mutex_);
    if (pending_.empty()) return;
    Pending oldest = pending_.front();
    pending_.pop_front();
    if (reply.iteration == oldest.tag) answers_[oldest.question] = std::move(reply.missing_ranks);
  }

 private:
  struct Pending {
    uint64_t question;
    uint32_t tag;
  };
  worker::ControlChannel& control_;
  uint32_t job_id_;
  uint32_t rank_;
  mutable std::mutex mutex_;
  uint64_t next_question_ = 0;
  std::deque<Pending> pending_;
  std::map<uint64_t, std::vector<uint32_t>> answers_;
};

}  // namespace

class Communicator::Impl {
 public:
  explicit Impl(CommunicatorConfig config)
      : config_(std::move(config)),
        aggregator_(validate(config_)),
        job_layout_(wire::layout_for(config_.max_elements + kPlacementSlackElements)),
        join_deadline_(Clock::now() + config_.join_timeout),
        control_(aggregator_, join_deadline_),
        joined_(join(join_deadline_)),
        transport_(joined_.result_port, data_address(), socket_buffer_bytes()),
        status_mailbox_(control_, config_.job_id, config_.rank),
        pipeline_(transport_,
                  {config_.job_id, joined_.token, static_cast<uint16_t>(config_.rank), joined_.chunks,
                   config_.window_chunks, config_.retransmit_interval,
                   std::min(kMaxStatusLead, config_.operation_timeout / 10)},
                  status_mailbox_),
        wake_(make_wake_fd()) {
    wait_for_start(join_deadline_);
    monitor_ = std::jthread([this](std::stop_token stop) { monitor_control(stop); });
    progress_ = std::jthread([this] { run_operations(); });
    spdlog::info("xagg: job {} rank {}/{} joined aggregator {} (data port {}, result port {})", config_.job_id,
                 config_.rank, config_.world_size, config_.aggregator, joined_.data_port, joined_.result_port);
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
    monitor_.request_stop();
    monitor_.join();
    try {
      control_.send(control::Leave{}, Clock::now() + kLeaveTimeout);
    } catch (const CommError& error) {
      spdlog::debug("xagg: job {} rank {}: leave not sent: {}", config_.job_id, config_.rank, error.what());
    }
  }

  const CommunicatorConfig& config() const { return config_; }

  template <class T>
  std::shared_ptr<Work> enqueue(T* data, size_t count, ReduceOp op) {
    if (count > config_.max_elements)
      throw ConfigError(fmt::format("allreduce of {} elements exceeds max_elements {}", count, config_.max_elements));
    if (data == nullptr && count > 0) throw ConfigError("allreduce of a null buffer");
    auto work = std::make_shared<OperationWork>();
    std::unique_ptr<worker::Reduction> reduction;
    if constexpr (std::is_same_v<T, float>)
      reduction = std::make_unique<worker::Float32Reduction>(data, count, op, config_.world_size);
    else
      reduction = std::make_unique<worker::Int32Reduction>(data, count, op, config_.world_size);
    push({std::move(reduction), work});
    return work;
  }

  void begin_step() { push({}); }

 private:
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
    queue_changed_.notify_one();
    uint64_t one = 1;
    // Only fails when the counter would overflow, which means the thread is awake anyway.
    [[maybe_unused]] ssize_t written = ::write(wake_.get(), &one, sizeof(one));
  }

  static UniqueFd make_wake_fd() {
    UniqueFd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!fd) throw CommError(fmt::format("eventfd: {}", std::strerror(errno)));
    return fd;
  }

  control::JoinReply join(Clock::time_point deadline) {
    control_.send(control::JoinRequest{config_.job_id, config_.rank, config_.world_size,
                                       config_.max_elements + kPlacementSlackElements},
                  deadline);
    auto reply = control_.receive(deadline);
    if (!reply)
      throw TimeoutError(fmt::format("job {} rank {}: no join reply from aggregator {} within {} ms", config_.job_id,
                                     config_.rank, config_.aggregator, config_.join_timeout.count()));
    // The aggregator's message counts the elements asked for, which include the placement slack.
    if (auto* error = std::get_if<control::Error>(&*reply))
      throw ConfigError(fmt::format("job {} rank {}: join refused: {} (this rank asked for {} elements: max_elements "
                                    "{} plus {} of placement slack)",
                                    config_.job_id, config_.rank, error->message,
                                    config_.max_elements + kPlacementSlackElements, config_.max_elements,
                                    kPlacementSlackElements));
    auto* joined = std::get_if<control::JoinReply>(&*reply);
    if (!joined)
      throw CommError(fmt::format("job {} rank {}: unexpected reply to join", config_.job_id, config_.rank));
    // The aggregator sizes the job exactly so (docs/protocol.md section 1); a
    // larger count would only make the per-chunk state huge.
    if (joined->chunks != job_layout_.total())
      throw CommError(fmt::format("job {} rank {}: join reply unusable: chunks {}, but max_elements {} plus {} "
                                  "elements of placement slack make {}",
                                  config_.job_id, config_.rank, joined->chunks, config_.max_elements,
                                  kPlacementSlackElements, job_layout_.total()));
    if (joined->data_port == 0 || joined->result_port == 0)
      throw CommError(fmt::format("job {} rank {}: join reply unusable: data port {}, result port {}", config_.job_id,
                                  config_.rank, joined->data_port, joined->result_port));
    return *joined;
  }

  void wait_for_start(Clock::time_point deadline) {
    for (;;) {
      auto message = control_.receive(deadline);
      if (!message)
        throw TimeoutError(fmt::format("job {} rank {}: not every rank joined within {} ms", config_.job_id,
                                       config_.rank, config_.join_timeout.count()));
      if (std::holds_alternative<control::Start>(*message)) return;
      if (auto* error = std::get_if<control::Error>(&*message)) throw CommError(error->message);
    }
  }

  sockaddr_in data_address() const {
    sockaddr_in address = aggregator_;
    address.sin_port = htons(joined_.data_port);
    return address;
  }

  // Room for a whole window of results arriving at once.
  size_t socket_buffer_bytes() const {
    constexpr size_t kMinimum = 4u << 20;
    return std::max(kMinimum, size_t{config_.window_chunks} * (wire::kPacketBytes + 512));
  }

  void monitor_control(std::stop_token stop) {
    try {
      while (!stop.stop_requested()) {
        auto message = control_.receive(Clock::now() + kMonitorPoll);
        if (!message) continue;
        if (auto* error = std::get_if<control::Error>(&*message)) {
          spdlog::error("xagg: job {} rank {}: aggregator reported: {}", config_.job_id, config_.rank, error->message);
          failure_.set(error->message);
          return;
        }
        if (auto* status = std::get_if<control::StatusReply>(&*message)) status_mailbox_.post(std::move(*status));
      }
    } catch (const CommError& error) {
      failure_.set(error.what());
    }
  }

  // Starts queued operations in call order as far as the pipeline has room,
  // and drives the pipeline while anything runs.
  void run_operations() {
    for (;;) {
      {
        std::unique_lock lock(queue_mutex_);
        if (pipeline_.idle()) queue_changed_.wait(lock, [this] { return closing_ || !queue_.empty(); });
        if (pipeline_.idle() && queue_.empty()) return;  // closing, and everything done
        uint64_t wakeups;
        [[maybe_unused]] ssize_t drained = ::read(wake_.get(), &wakeups, sizeof(wakeups));
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

  CommunicatorConfig config_;
  sockaddr_in aggregator_;
  wire::ChunkLayout job_layout_;
  Clock::time_point join_deadline_;
  worker::ControlChannel control_;
  control::JoinReply joined_;
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

  std::jthread monitor_;
  std::jthread progress_;
};

Communicator::Communicator(CommunicatorConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}

Communicator::~Communicator() = default;

void Communicator::allreduce(float* data, size_t count, ReduceOp op) { allreduce_async(data, count, op)->wait(); }

void Communicator::allreduce(int32_t* data, size_t count, ReduceOp op) { allreduce_async(data, count, op)->wait(); }

std::shared_ptr<Work> Communicator::allreduce_async(float* data, size_t count, ReduceOp op) {
  return impl_->enqueue(data, count, op);
}

std::shared_ptr<Work> Communicator::allreduce_async(int32_t* data, size_t count, ReduceOp op) {
  return impl_->enqueue(data, count, op);
}

void Communicator::begin_step() { impl_->begin_step(); }

uint32_t Communicator::rank() const { return impl_->config().rank; }

uint32_t Communicator::world_size() const { return impl_->config().world_size; }

}  // namespace xagg
