// Bucketed gradient all-reduce overlapped with backward, as DDP does it: the
// gradients live in one flat buffer, parameters in reverse registration order
// (the order in which backward produces their gradients), grouped into buckets
// of consecutive parameters. Once every parameter of a bucket has its gradient,
// the bucket's asynchronous all-reduce starts while backward goes on (XAgg
// runs a step's buckets at once; the baselines one after another).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
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

  // The gradient of parameter `param` (flat-buffer order) is final for this step.
  void mark_ready(size_t param);
  // After backward: launches buckets with parameters that got no gradient, waits
  // until every bucket is averaged and rethrows a communication error.
  void finish_step();
  // Seconds from each step's first bucket launch to its last bucket's
  // completion, summed since the last call.
  double take_busy_seconds();

  size_t bucket_count() const { return buckets_.size(); }

 private:
  // Buckets go out strictly in index order so that every rank issues the same sequence.
  void launch_ready_buckets();

  backends::Backend& backend_;
  float* flat_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_param_;

  std::mutex mutex_;  // mark_ready may run on several autograd threads
  std::vector<size_t> missing_;  // per bucket: parameters still without a gradient this step
  std::vector<std::shared_ptr<Work>> launched_;  // this step's, in bucket order
  std::chrono::steady_clock::time_point first_launch_;
  double busy_seconds_ = 0;
};

}  // namespace xagg::train
