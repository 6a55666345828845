#include "gradient_buckets.h"

#include <chrono>
#include <utility>

namespace xagg::train {

std::vector<Bucket> make_buckets(const std::vector<size_t>& param_sizes, size_t bucket_elements) {
  std::vector<Bucket> buckets;
  size_t offset = 0;
  for (size_t param = 0; param < param_sizes.size(); ++param) {
    if (buckets.empty() || buckets.back().count >= bucket_elements) buckets.push_back(Bucket{.offset = offset, .count = 0, .params = {}});
    buckets.back().count += param_sizes[param];
    buckets.back().params.push_back(param);
    offset += param_sizes[param];
  }
  return buckets;
}

BucketReducer::BucketReducer(backends::Backend& backend, float* flat, std::vector<Bucket> buckets)
    : backend_(backend), flat_(flat), buckets_(std::move(buckets)) {
  for (size_t bucket = 0; bucket < buckets_.size(); ++bucket) {
    for (size_t param : buckets_[bucket].params) {
      if (bucket_of_param_.size() <= param) bucket_of_param_.resize(param + 1);
      bucket_of_param_[param] = bucket;
    }
    missing_.push_back(buckets_[bucket].params.size());
  }
  thread_ = std::thread(&BucketReducer::communicate, this);
}

BucketReducer::~BucketReducer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void BucketReducer::mark_ready(size_t param) {
  std::unique_lock lock(mutex_);
  --missing_[bucket_of_param_[param]];
  launch_ready_buckets(lock);
}

void BucketReducer::launch_ready_buckets(std::unique_lock<std::mutex>&) {
  bool launched = false;
  while (next_launch_ < buckets_.size() && missing_[next_launch_] == 0) {
    queue_.push_back(next_launch_++);
    launched = true;
  }
  if (launched) changed_.notify_all();
}

void BucketReducer::finish_step() {
  std::unique_lock lock(mutex_);
  for (size_t& missing : missing_) missing = 0;
  launch_ready_buckets(lock);
  changed_.wait(lock, [this] { return completed_ == buckets_.size() || error_; });
  if (error_) std::rethrow_exception(error_);
  for (size_t bucket = 0; bucket < buckets_.size(); ++bucket) missing_[bucket] = buckets_[bucket].params.size();
  next_launch_ = 0;
  completed_ = 0;
}

double BucketReducer::take_busy_seconds() {
  std::lock_guard lock(mutex_);
  return std::exchange(busy_seconds_, 0.0);
}

void BucketReducer::communicate() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    const Bucket& bucket = buckets_[queue_.front()];
    queue_.pop_front();
    lock.unlock();
    auto start = std::chrono::steady_clock::now();
    std::exception_ptr error;
    try {
      backend_.allreduce(flat_ + bucket.offset, bucket.count, ReduceOp::Average);
    } catch (...) {
      error = std::current_exception();
    }
    std::chrono::duration<double> busy = std::chrono::steady_clock::now() - start;
    lock.lock();
    busy_seconds_ += busy.count();
    if (error && !error_) error_ = error;
    ++completed_;
    changed_.notify_all();
  }
}

}  // namespace xagg::train
