#include "baselines/tcp_ps/tcp_ps_server.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "baselines/tcp_ps/socket_util.h"
#include "xagg/errors.h"

namespace xagg::baselines {

using namespace tcp_ps;

namespace {

constexpr uint32_t kMaxWorldSize = 1024;
constexpr timeval kErrorSendTimeout{1, 0};  // an error frame must not hold up teardown

timeval to_timeval(std::chrono::milliseconds duration) {
  return {static_cast<time_t>(duration.count() / 1000), static_cast<suseconds_t>(duration.count() % 1000 * 1000)};
}

void set_timeout(int fd, int option, timeval timeout) {
  if (setsockopt(fd, SOL_SOCKET, option, &timeout, sizeof(timeout)) != 0) throw_errno("setting a socket timeout");
}

// Why a blocking transfer on a worker connection stopped, from its errno.
std::string transfer_failure(int error) {
  if (error == 0) return "closed the connection";
  if (error == EAGAIN || error == EWOULDBLOCK) return "timed out";
  return std::strerror(error);
}

bool send_frame(int fd, FrameType type, const void* payload, uint32_t payload_bytes) {
  FrameHeader header{type, payload_bytes};
  return send_all(fd, &header, sizeof(header), MSG_MORE) && send_all(fd, payload, payload_bytes);
}

}  // namespace

// One all-reduce job: the receive threads fill per-rank rings of chunk slots,
// the reducing thread sums complete chunks and streams them to every rank.
class TcpPsServer::Job {
 public:
  struct Worker {
    UniqueFd fd;
    uint64_t max_elements = 0;
  };

  Job(std::vector<Worker> workers, const TcpPsServerConfig& config)
      : workers_(std::move(workers)),
        chunk_elements_(config.chunk_bytes / sizeof(float)),
        ring_chunks_(config.ring_chunks),
        slots_(workers_.size() * ring_chunks_ * chunk_elements_),
        output_(chunk_elements_),
        requests_(workers_.size()),
        chunks_received_(workers_.size()) {}

  // Reduces iterations until a worker leaves, fails or abort() is called.
  void run() {
    std::vector<std::jthread> receivers;
    for (uint32_t rank = 0; rank < workers_.size(); ++rank)
      receivers.emplace_back([this, rank] { receive_from(rank); });
    uint64_t iteration = 0;
    while (reduce_iteration(iteration)) ++iteration;
    tell_workers_and_close();
  }

  // Thread-safe.
  void abort(const std::string& reason) {
    std::lock_guard lock(mutex_);
    fail_locked(reason);
  }

 private:
  uint32_t world_size() const { return static_cast<uint32_t>(workers_.size()); }
  size_t chunk_count(uint64_t count) const { return (count + chunk_elements_ - 1) / chunk_elements_; }
  size_t elements_in_chunk(size_t chunk) const {
    return std::min<uint64_t>(chunk_elements_, count_ - chunk * chunk_elements_);
  }
  float* slot(uint32_t rank, size_t chunk) {
    return slots_.data() + (rank * ring_chunks_ + chunk % ring_chunks_) * chunk_elements_;
  }

  // Waits for `ready` under the lock; false once the job has failed.
  template <typename Predicate>
  bool wait(std::unique_lock<std::mutex>& lock, std::condition_variable& condition, Predicate ready) {
    condition.wait(lock, [&] { return failure_ || ready(); });
    return !failure_;
  }

  // The first failure wins; SHUT_RD wakes receive threads blocked in recv().
  void fail_locked(const std::string& reason) {
    if (failure_) return;
    failure_ = reason;
    for (auto& worker : workers_) ::shutdown(worker.fd.get(), SHUT_RD);
    work_arrived_.notify_all();
    progress_.notify_all();
  }

  void receive_from(uint32_t rank) {
    const int fd = workers_[rank].fd.get();
    for (uint64_t iteration = 0;; ++iteration) {
      Request request;
      bool received = recv_all(fd, &request, sizeof(request));
      int error = errno;
      std::unique_lock lock(mutex_);
      if (!received) return fail_locked(fmt::format("rank {} left the job ({})", rank, transfer_failure(error)));
      requests_[rank] = request;
      ++requests_received_;
      work_arrived_.notify_all();
      if (!wait(lock, progress_, [&] { return iterations_started_ > iteration; })) return;

      for (size_t chunk = 0, chunks = chunk_count(count_); chunk < chunks; ++chunk) {
        if (!wait(lock, progress_, [&] { return chunks_reduced_ + ring_chunks_ > chunk; })) return;
        const size_t bytes = elements_in_chunk(chunk) * sizeof(float);
        lock.unlock();
        received = recv_all(fd, slot(rank, chunk), bytes);  // straight into the ring, no copy
        error = errno;
        lock.lock();
        if (!received)
          return fail_locked(fmt::format("rank {} {} during all-reduce #{} (chunk {} of {})", rank,
                                         transfer_failure(error), iteration, chunk, chunks));
        chunks_received_[rank] = chunk + 1;
        work_arrived_.notify_all();
      }
      if (!wait(lock, progress_, [&] { return iterations_completed_ > iteration; })) return;
    }
  }

  // False once the job has failed.
  bool reduce_iteration(uint64_t iteration) {
    std::unique_lock lock(mutex_);
    if (!wait(lock, work_arrived_, [&] { return requests_received_ == world_size(); })) return false;
    for (uint32_t rank = 0; rank < world_size(); ++rank) {
      const Request& request = requests_[rank];
      if (request.iteration != iteration || request.count != requests_[0].count) {
        fail_locked(fmt::format("ranks disagree on all-reduce #{}: rank 0 sent #{} of {} floats, rank {} #{} of {}",
                                iteration, requests_[0].iteration, requests_[0].count, rank, request.iteration,
                                request.count));
        return false;
      }
      if (request.count > workers_[rank].max_elements) {
        fail_locked(fmt::format("rank {} sent {} floats, more than its announced maximum {}", rank, request.count,
                                workers_[rank].max_elements));
        return false;
      }
    }
    count_ = requests_[0].count;
    requests_received_ = 0;
    chunks_reduced_ = 0;
    std::fill(chunks_received_.begin(), chunks_received_.end(), 0);
    iterations_started_ = iteration + 1;
    progress_.notify_all();

    for (size_t chunk = 0, chunks = chunk_count(count_); chunk < chunks; ++chunk) {
      auto all_arrived = [&] { return *std::min_element(chunks_received_.begin(), chunks_received_.end()) > chunk; };
      if (!wait(lock, work_arrived_, all_arrived)) return false;
      lock.unlock();
      const size_t elements = elements_in_chunk(chunk);
      sum_chunk(chunk, elements);
      std::optional<uint32_t> unreachable;
      int error = 0;
      for (uint32_t rank = 0; rank < world_size() && !unreachable; ++rank) {
        if (!send_frame(workers_[rank].fd.get(), FrameType::Result, output_.data(), elements * sizeof(float))) {
          unreachable = rank;
          error = errno;
        }
      }
      lock.lock();
      if (unreachable) {
        fail_locked(fmt::format("sending results of all-reduce #{} to rank {}: {}", iteration, *unreachable,
                                transfer_failure(error)));
        return false;
      }
      chunks_reduced_ = chunk + 1;
      progress_.notify_all();
    }
    iterations_completed_ = iteration + 1;
    progress_.notify_all();
    return true;
  }

  // Float sum in rank order, so every run gives bit-identical results.
  void sum_chunk(size_t chunk, size_t elements) {
    float* __restrict sum = output_.data();
    std::copy_n(slot(0, chunk), elements, sum);
    for (uint32_t rank = 1; rank < world_size(); ++rank) {
      const float* __restrict addend = slot(rank, chunk);
      for (size_t i = 0; i < elements; ++i) sum[i] += addend[i];
    }
  }

  // Every still connected rank gets the reason as an Error frame, so its
  // all-reduce throws instead of waiting for its deadline.
  void tell_workers_and_close() {
    std::string reason;
    {
      std::lock_guard lock(mutex_);
      reason = failure_->substr(0, kMaxMessageBytes);
    }
    spdlog::info("tcp-ps: job of {} workers ended: {}", world_size(), reason);
    for (auto& worker : workers_) {
      setsockopt(worker.fd.get(), SOL_SOCKET, SO_SNDTIMEO, &kErrorSendTimeout, sizeof(kErrorSendTimeout));
      send_frame(worker.fd.get(), FrameType::Error, reason.data(), static_cast<uint32_t>(reason.size()));
      ::shutdown(worker.fd.get(), SHUT_RDWR);
    }
  }

  std::vector<Worker> workers_;
  const size_t chunk_elements_;
  const size_t ring_chunks_;
  std::vector<float> slots_;   // [rank][ring slot][element]
  std::vector<float> output_;  // the chunk being sent back

  std::mutex mutex_;
  std::condition_variable work_arrived_;  // the reducer waits on it
  std::condition_variable progress_;      // the receive threads wait on it
  std::optional<std::string> failure_;
  std::vector<Request> requests_;
  uint32_t requests_received_ = 0;
  uint64_t count_ = 0;  // of the current iteration
  uint64_t iterations_started_ = 0;
  uint64_t iterations_completed_ = 0;
  std::vector<size_t> chunks_received_;  // per rank, in the current iteration
  size_t chunks_reduced_ = 0;
};

TcpPsServer::TcpPsServer(TcpPsServerConfig config) : config_(std::move(config)) {
  if (config_.chunk_bytes < sizeof(float) || config_.chunk_bytes % sizeof(float) != 0 ||
      config_.chunk_bytes > UINT32_MAX || config_.ring_chunks == 0)
    throw ConfigError("tcp-ps: chunk_bytes must be a positive multiple of 4 below 4 GiB and ring_chunks positive");
  if (config_.world_size > kMaxWorldSize)
    throw ConfigError(fmt::format("tcp-ps: world size {} above {}", config_.world_size, kMaxWorldSize));
  sockaddr_in address = make_address(config_.bind_address, config_.port);
  listener_ = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener_) throw_errno("tcp-ps: creating the listening socket");
  int on = 1;
  setsockopt(listener_.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (::bind(listener_.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0)
    throw_errno(fmt::format("tcp-ps: binding {}:{}", config_.bind_address, config_.port));
  if (::listen(listener_.get(), SOMAXCONN) != 0) throw_errno("tcp-ps: listen");
  socklen_t length = sizeof(address);
  getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&address), &length);
  port_ = ntohs(address.sin_port);
  wakeup_ = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wakeup_) throw_errno("tcp-ps: eventfd");
}

TcpPsServer::~TcpPsServer() = default;

void TcpPsServer::run() {
  spdlog::info("tcp-ps: listening on {}:{}", config_.bind_address, port_);
  while (auto job = gather_job()) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) job->abort("server stopping");
      running_job_ = job.get();
    }
    job->run();
    std::lock_guard lock(mutex_);
    running_job_ = nullptr;
  }
}

void TcpPsServer::stop() {
  std::lock_guard lock(mutex_);
  stopping_ = true;
  const uint64_t one = 1;
  if (::write(wakeup_.get(), &one, sizeof(one)) < 0)
    spdlog::warn("tcp-ps: waking the server: {}", std::strerror(errno));
  if (running_job_) running_job_->abort("server stopping");
}

std::unique_ptr<TcpPsServer::Job> TcpPsServer::gather_job() {
  uint32_t world_size = config_.world_size;
  std::vector<Job::Worker> ranks(world_size);  // a rank without fd has not said hello yet
  uint32_t joined = 0;

  // Returns the reason a hello is refused, or nothing if it joined and took fd.
  auto admit = [&](UniqueFd& fd, const Hello& hello) -> std::string {
    if (hello.magic != kMagic) return "not a tcp-ps hello";
    if (hello.world_size == 0 || hello.world_size > kMaxWorldSize)
      return fmt::format("world size {} outside 1..{}", hello.world_size, kMaxWorldSize);
    if (world_size == 0) {
      world_size = hello.world_size;
      ranks.resize(world_size);
    }
    if (hello.world_size != world_size)
      return fmt::format("world size {} but the job has {}", hello.world_size, world_size);
    if (hello.rank >= world_size) return fmt::format("rank {} outside 0..{}", hello.rank, world_size - 1);
    if (ranks[hello.rank].fd) return fmt::format("rank {} has already joined", hello.rank);
    ranks[hello.rank] = {std::move(fd), hello.max_elements};
    ++joined;
    return {};
  };

  // A connection that fails before its hello is dropped; the server keeps serving.
  auto accept_one = [&] {
    UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd) throw_errno("accept");
    Hello hello;
    set_timeout(fd.get(), SO_RCVTIMEO, to_timeval(config_.hello_timeout));
    if (!recv_all(fd.get(), &hello, sizeof(hello)))
      throw CommError(fmt::format("no hello: {}", transfer_failure(errno)));
    set_timeout(fd.get(), SO_RCVTIMEO, {0, 0});  // in a job, a quiet worker is the clients' deadline to judge
    set_timeout(fd.get(), SO_SNDTIMEO, to_timeval(config_.send_timeout));
    tune_socket(fd.get(), config_.socket_buffer_bytes);
    std::string refusal = admit(fd, hello);
    if (refusal.empty()) {
      spdlog::info("tcp-ps: rank {} joined ({}/{})", hello.rank, joined, world_size);
      return;
    }
    spdlog::warn("tcp-ps: refused a hello: {}", refusal);
    HelloReply reply{kMagic, HelloStatus::Rejected, static_cast<uint32_t>(refusal.size()), world_size};
    send_all(fd.get(), &reply, sizeof(reply)) && send_all(fd.get(), refusal.data(), refusal.size());
  };

  while (world_size == 0 || joined < world_size) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return nullptr;
    }
    std::vector<pollfd> watched{{wakeup_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
    for (auto& rank : ranks)
      if (rank.fd) watched.push_back({rank.fd.get(), POLLIN, 0});  // readable before the reply: it left
    if (::poll(watched.data(), watched.size(), -1) < 0) {
      if (errno == EINTR) continue;
      throw_errno("tcp-ps: poll");
    }
    for (size_t i = 2; i < watched.size(); ++i) {
      if (watched[i].revents == 0) continue;
      auto left = std::find_if(ranks.begin(), ranks.end(), [&](auto& rank) { return rank.fd.get() == watched[i].fd; });
      spdlog::info("tcp-ps: rank {} left before the job started", left - ranks.begin());
      left->fd.reset();
      --joined;
    }
    if (joined == 0 && config_.world_size == 0) {
      world_size = 0;
      ranks.clear();
    }
    if (watched[1].revents & POLLIN) {
      try {
        accept_one();
      } catch (const CommError& error) {
        spdlog::warn("tcp-ps: dropped a connection: {}", error.what());
      }
    }
  }

  for (auto& rank : ranks) {
    HelloReply reply{kMagic, HelloStatus::Accepted, 0, world_size};
    send_all(rank.fd.get(), &reply, sizeof(reply));  // a failure shows up as a disconnect in the job
  }
  return std::make_unique<Job>(std::move(ranks), config_);
}

}  // namespace xagg::baselines
