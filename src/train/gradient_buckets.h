// Bucketed gradient all-reduce overlapped with backward, as DDP does it: the
// gradients live in one flat buffer, parameters in reverse registration order
// (the order in which backward produces their gradients), grouped into buckets
// of consecutive parameters. Once every parameter of a bucket has its gradient,
// the bucket is all-reduced on a communication thread while backward goes on.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "backend.h"

namespace xagg::train {

struct Bucket {
  size_t offset = 0;  // into the flat buffer
  size_t count = 0;
  std::vector<size_t> params;  // indexes into the flat-buffer order
};

// Consecutive parameters (sizes in flat-buffer order) into buckets of at least
// bucket_elements each; the last one may be smaller.
std::vector<Bucket> make_buckets(const std::vector<size_t>& param_sizes, size_t bucket_elements);

class BucketReducer {
 public:
  // Averages each bucket of `flat` across the ranks of `backend`.
  BucketReducer(backends::Backend& backend, float* flat, std::vector<Bucket> buckets);
  ~BucketReducer();
  BucketReducer(const BucketReducer&) = delete;
  BucketReducer& operator=(const BucketReducer&) = delete;

  // The gradient of parameter `param` (flat-buffer order) is final for this step.
  void mark_ready(size_t param);
  // After backward: launches buckets with parameters that got no gradient, waits
  // until every bucket is averaged and rethrows a communication error.
  void finish_step();
  // Seconds the communication thread spent all-reducing since the last call.
  double take_busy_seconds();

  size_t bucket_count() const { return buckets_.size(); }

 private:
  // Buckets go out strictly in index order so that every rank issues the same sequence.
  void launch_ready_buckets(std::unique_lock<std::mutex>& lock);
  void communicate();

  backends::Backend& backend_;
  float* flat_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_param_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<size_t> missing_;  // per bucket: parameters still without a gradient this step
  size_t next_launch_ = 0;
  size_t completed_ = 0;
  std::deque<size_t> queue_;
  std::exception_ptr error_;
  double busy_seconds_ = 0;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once everything above is initialized
};

}  // namespace xagg::train
