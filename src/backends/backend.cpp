#include "backend.h"

#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "baselines/switch/switch_client.h"

namespace xagg::backends {
namespace {

class FutureWork final : public Work {
 public:
  explicit FutureWork(std::shared_future<void> done) : done_(std::move(done)) {}
  bool completed() const override { return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
  void wait() override { done_.get(); }

 private:
  std::shared_future<void> done_;
};

class OneAtATime final : public Backend {
 public:
  explicit OneAtATime(std::unique_ptr<BlockingBackend> system)
      : system_(std::move(system)), thread_([this](std::stop_token stop) { run(stop); }) {}

  ~OneAtATime() override {
    {
      // Under the mutex: between the worker's check of its condition and its
      // wait, a stop and its notification would be lost and join() would hang.
      std::lock_guard lock(mutex_);
      thread_.request_stop();
    }
    queue_changed_.notify_all();
    thread_.join();  // queued all-reduces still run: other ranks need this rank's share
  }

  std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op) override {
    std::packaged_task<void()> task([this, data, count, op] { system_->allreduce(data, count, op); });
    auto work = std::make_shared<FutureWork>(task.get_future().share());
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(task));
    }
    queue_changed_.notify_one();
    return work;
  }

 private:
  void run(std::stop_token stop) {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock lock(mutex_);
        queue_changed_.wait(lock, [&] { return stop.stop_requested() || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();  // an exception lands in the task's future
    }
  }

  std::unique_ptr<BlockingBackend> system_;
  std::mutex mutex_;
  std::condition_variable queue_changed_;
  std::deque<std::packaged_task<void()>> queue_;
  std::jthread thread_;  // last: it uses the members above
};

}  // namespace

std::unique_ptr<Backend> one_at_a_time(std::unique_ptr<BlockingBackend> system) {
  return std::make_unique<OneAtATime>(std::move(system));
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names{"xagg", "tcp-ps", "gloo"};
  for (const auto& variant : baselines::switchml::kSwitchVariants) names.emplace_back(variant.name);
  return names;
}

bool supports_wire_bits(const std::string& backend, uint32_t wire_bits) {
  return wire_bits == 32 || (wire_bits == 16 && (backend == "xagg" || backend == "gloo"));
}

std::unique_ptr<Backend> make_backend(const BackendConfig& config) {
  if (!supports_wire_bits(config.name, config.wire_bits))
    throw ConfigError(fmt::format("backend '{}' cannot send {} bits per element (32; 16: xagg and gloo)", config.name,
                                  config.wire_bits));
  if (config.name == "xagg") return make_xagg_backend(config);
  if (config.name == "tcp-ps") return make_tcp_ps_backend(config);
  if (config.name == "gloo") return make_gloo_backend(config);
  if (baselines::switchml::switch_pool_shape(config.name)) return make_switch_backend(config);
  throw ConfigError(fmt::format("unknown backend '{}' (known: {})", config.name, fmt::join(backend_names(), ", ")));
}

}  // namespace xagg::backends
