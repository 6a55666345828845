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
}

void BucketReducer::mark_ready(size_t param) {
  std::lock_guard lock(mutex_);
  --missing_[bucket_of_param_[param]];
  launch_ready_buckets();
}

void BucketReducer::launch_ready_buckets() {
  while (launched_.size() < buckets_.size() && missing_[launched_.size()] == 0) {
    if (launched_.empty()) {
      backend_.begin_step();
      first_launch_ = std::chrono::steady_clock::now();
    }
    const Bucket& bucket = buckets_[launched_.size()];
    launched_.push_back(backend_.allreduce_async(flat_ + bucket.offset, bucket.count, ReduceOp::Average));
  }
}

void BucketReducer::finish_step() {
  std::lock_guard lock(mutex_);
  for (size_t& missing : missing_) missing = 0;
  launch_ready_buckets();
  // Every Work is waited for, even after an error, so that none still writes into flat_.
  std::exception_ptr error;
  for (auto& work : launched_) {
    try {
      work->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  std::chrono::duration<double> busy = std::chrono::steady_clock::now() - first_launch_;
  busy_seconds_ += busy.count();
  launched_.clear();
  for (size_t bucket = 0; bucket < buckets_.size(); ++bucket) missing_[bucket] = buckets_[bucket].params.size();
  if (error) std::rethrow_exception(error);
}

double BucketReducer::take_busy_seconds() {
  std::lock_guard lock(mutex_);
  return std::exchange(busy_seconds_, 0.0);
}

}  // namespace xagg::train
