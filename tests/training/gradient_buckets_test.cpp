// Bucketing and the overlapped, in-order bucket all-reduce of src/train,
// against a recording backend (no network).
#include "gradient_buckets.h"

#include <gtest/gtest.h>

#include <mutex>

namespace {

using xagg::train::BucketReducer;
using xagg::train::make_buckets;

// A Work that is already complete, with an optional error.
struct DoneWork : xagg::Work {
  explicit DoneWork(std::exception_ptr error = nullptr) : error(std::move(error)) {}
  bool completed() const override { return true; }
  void wait() override {
    if (error) std::rethrow_exception(error);
  }
  std::exception_ptr error;
};

// Records the (offset, count) of each all-reduce and the steps begun, and
// halves the data (an average over 2 equal ranks would not change it).
struct RecordingBackend : xagg::backends::Backend {
  explicit RecordingBackend(const float* base) : base(base) {}
  std::shared_ptr<xagg::Work> allreduce_async(float* data, size_t count, xagg::ReduceOp op) override {
    std::lock_guard lock(mutex);
    EXPECT_EQ(op, xagg::ReduceOp::Average);
    calls.emplace_back(data - base, count);
    for (size_t i = 0; i < count; ++i) data[i] /= 2;
    return std::make_shared<DoneWork>();
  }
  void begin_step() override {
    std::lock_guard lock(mutex);
    calls.emplace_back(-1, 0);
  }
  const float* base;
  std::mutex mutex;
  std::vector<std::pair<ptrdiff_t, size_t>> calls;  // (-1, 0): a step begins
};

TEST(MakeBuckets, GroupsConsecutiveParametersUpToTheCap) {
  auto buckets = make_buckets({10, 5, 100, 3, 4}, 12);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].params, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(buckets[1].offset, 15u);
  EXPECT_EQ(buckets[1].params, (std::vector<size_t>{2}));
  EXPECT_EQ(buckets[2].offset, 115u);
  EXPECT_EQ(buckets[2].count, 7u);
}

TEST(BucketReducer, LaunchesBucketsInOrderOnceAllTheirParametersAreReady) {
  std::vector<float> flat(16, 2.0f);
  RecordingBackend backend(flat.data());
  BucketReducer reducer(backend, flat.data(), make_buckets({4, 4, 4, 4}, 8));
  for (int step = 0; step < 2; ++step) {
    reducer.mark_ready(2);  // bucket 1 complete before bucket 0: must wait for it
    reducer.mark_ready(3);
    reducer.mark_ready(0);
    reducer.mark_ready(1);
    reducer.finish_step();
  }
  std::vector<std::pair<ptrdiff_t, size_t>> expected = {{-1, 0}, {0, 8}, {8, 8}, {-1, 0}, {0, 8}, {8, 8}};
  EXPECT_EQ(backend.calls, expected);
  EXPECT_FLOAT_EQ(flat[15], 0.5f);
}

TEST(BucketReducer, FinishStepSendsBucketsWithoutGradients) {
  std::vector<float> flat(8, 1.0f);
  RecordingBackend backend(flat.data());
  BucketReducer reducer(backend, flat.data(), make_buckets({4, 4}, 4));
  reducer.mark_ready(1);  // parameter 0 got no gradient this step
  reducer.finish_step();
  std::vector<std::pair<ptrdiff_t, size_t>> expected = {{-1, 0}, {0, 4}, {4, 4}};  // the step, then both buckets
  EXPECT_EQ(backend.calls, expected);
}

TEST(BucketReducer, RethrowsACommunicationError) {
  struct FailingBackend : xagg::backends::Backend {
    std::shared_ptr<xagg::Work> allreduce_async(float*, size_t, xagg::ReduceOp) override {
      return std::make_shared<DoneWork>(std::make_exception_ptr(xagg::CommError("link down")));
    }
  } backend;
  std::vector<float> flat(4);
  BucketReducer reducer(backend, flat.data(), make_buckets({4}, 4));
  EXPECT_THROW(reducer.finish_step(), xagg::CommError);
}

}  // namespace
