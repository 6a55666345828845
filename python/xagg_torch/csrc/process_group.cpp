// The "xagg" c10d backend: a ProcessGroup whose all-reduce and reduce-scatter
// go through XAgg aggregators (libxagg). The collectives without a reduction
// (broadcast, allgather, ...) and the reductions the aggregators cannot do
// exactly (float64, PRODUCT, the bitwise ops) move exact bytes through the c10d
// store; barrier is a one-element all-reduce.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/extension.h>
#include <spdlog/spdlog.h>
#include <xagg/communicator.h>
#include <xagg/secret.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <tuple>

namespace {

// torch 1.13's Work::create_from_future drops the future's error on wait():
// a plain dist.all_reduce would return with the rank's own input in the
// tensor. This Work rethrows it from wait() and wait(timeout) alike.
class XaggWork : public c10d::Work {
 public:
  explicit XaggWork(std::vector<at::Tensor> tensors)
      : tensors_(std::move(tensors)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  void complete(std::exception_ptr error) {
    finish(error);
    if (error) future_->setError(error);
    else future_->markCompleted(c10::IValue(tensors_));
  }

  std::vector<at::Tensor> result() override { return tensors_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> tensors_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

using Clock = std::chrono::steady_clock;

class ProcessGroupXagg : public c10d::ProcessGroup {
  static constexpr int kLimbBits = 22;  // an int64 SUM's limbs (add_int64_allreduce)
  static constexpr uint64_t kLimbMask = (uint64_t{1} << kLimbBits) - 1;
  // A wait on the store polls it, from the first interval doubling to the last:
  // quick when the peer is already there, cheap when it is long in coming.
  static constexpr auto kFirstPoll = std::chrono::microseconds(100);
  static constexpr auto kLastPoll = std::chrono::milliseconds(5);

 public:
  ProcessGroupXagg(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                   const std::vector<std::string>& aggregators, const std::vector<uint32_t>& aggregator_weights,
                   uint32_t job_id, uint64_t max_elements, std::chrono::milliseconds timeout,
                   const std::string& secret_file, uint32_t mtu, std::chrono::milliseconds aggregator_dead_after,
                   const std::string& root_aggregator, uint32_t ranks_per_leaf, uint32_t wire_bits,
                   uint32_t half_wire_bits)
      : c10d::ProcessGroup(rank, size),
        store_(std::move(store)),
        half_wire_bits_(half_wire_bits),
        // The group's timeout bounds every blocking step (libxagg's longest is 24 h).
        timeout_(std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24))) {
    // The store's own timeout is left alone: every group shares the store, so
    // this group's waits on it keep their own deadline (await_keys).
    xagg::CommunicatorConfig config;
    config.aggregators = aggregators;
    config.aggregator_weights = aggregator_weights;
    config.job_id = job_id;
    config.rank = static_cast<uint32_t>(rank);
    config.world_size = static_cast<uint32_t>(size);
    config.max_elements = max_elements;
    config.mtu = mtu;
    config.aggregator_dead_after = aggregator_dead_after;
    config.root_aggregator = root_aggregator;
    config.ranks_per_leaf = ranks_per_leaf;
    config.wire_bits = wire_bits;
    TORCH_CHECK(half_wire_bits == 16 || half_wire_bits == 32, "xagg: half_wire_bits ", half_wire_bits,
                " is not 16 or 32");
    if (!secret_file.empty()) config.cluster_secret = xagg::read_secret_file(secret_file);
    config.join_timeout = timeout_;
    config.operation_timeout = timeout_;
    communicator_ = std::make_unique<xagg::Communicator>(config);
    completer_ = std::thread(&ProcessGroupXagg::complete_in_order, this);
    receiver_ = std::thread(&ProcessGroupXagg::complete_receives, this);
  }

  // Python drops the last reference with the GIL held (destroy_process_group),
  // while this group's threads may need it to free a tensor Python owns or to
  // run a future's Python callback: release it while they finish.
  ~ProcessGroupXagg() override {
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release release;
      shutdown();
    } else {
      shutdown();
    }
  }

  // Completes the collectives queued, fails the receives still pending and
  // leaves the job. Also run at interpreter exit (xagg_torch registers it).
  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    queued_.notify_all();
    receive_posted_.notify_all();
    if (receiver_.joinable()) receiver_.join();
    if (completer_.joinable()) completer_.join();
    communicator_.reset();
  }

  const std::string getBackendName() const override { return "xagg"; }

  // The all-reduces that follow belong to a new training step (Communicator::begin_step).
  void begin_step() { open_communicator().begin_step(); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& options) override {
    TORCH_CHECK(tensors.size() == 1, "xagg: one tensor per all-reduce");
    return queue_allreduces(tensors, options.reduceOp);
  }

  // An all-reduce of a floating tensor at a width of its own (16 or 32 bits
  // on the wire), whatever its dtype's default: the DDP hook's.
  c10::intrusive_ptr<c10d::Work> allreduce_on_wire(at::Tensor& tensor, const c10d::ReduceOp& reduce,
                                                   uint32_t wire_bits) {
    TORCH_CHECK(at::isFloatingType(tensor.scalar_type()) && tensor.scalar_type() != at::kDouble &&
                    through_aggregators(tensor.scalar_type(), reduce),
                "xagg: an all-reduce on a wire of its own is of float32, float16 or bfloat16 with SUM, AVG, MAX or "
                "MIN, not ", tensor.scalar_type(), " with ", op_name(reduce));
    TORCH_CHECK(wire_bits == 16 || wire_bits == 32, "xagg: wire_bits ", wire_bits, " is not 16 or 32");
    std::vector<at::Tensor> tensors{tensor};
    Pending pending{{}, {}, c10::make_intrusive<XaggWork>(tensors)};
    add_allreduce(pending, tensor, reduce, wire_bits);
    return queue(std::move(pending));
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& options) override {
    return queue_allreduces(tensors, options.reduceOp);
  }

  // Every rank gets the result; torch leaves the non-roots' tensors unspecified.
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& options) override {
    TORCH_CHECK(tensors.size() == 1, "xagg: one tensor per reduce");
    return queue_allreduces(tensors, options.reduceOp);
  }

  // Rank r's output is the reduction of every rank's inputs[0][r]; the
  // aggregators send each shard's values to its owner alone.
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& options) override {
    TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize()),
                "xagg: reduce_scatter of world-size tensors into one tensor");
    return queue_reduce_scatter(outputs[0], inputs[0], options.reduceOp);
  }

  // reduce_scatter_tensor: the input's world-size equal parts are the shards.
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& options) override {
    TORCH_CHECK(input.numel() == output.numel() * getSize(),
                "xagg: reduce_scatter_tensor needs an input of world size times the output's elements, got ",
                input.numel(), " and ", output.numel());
    std::vector<at::Tensor> shards = input.contiguous().view({getSize(), -1}).unbind();
    return queue_reduce_scatter(output, shards, options.reduceOp);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& options) override {
    std::string key = next_key("broadcast");
    const auto deadline = Clock::now() + timeout_;
    for (size_t index = 0; index < tensors.size(); ++index) {
      std::string tensor_key = key + "/" + std::to_string(index);
      if (getRank() == options.rootRank) {
        store_->set(tensor_key, bytes_of(tensors[index]));
      } else {
        await_keys({{tensor_key, static_cast<int>(options.rootRank)}},
                   fmt::format("broadcast from rank {}", options.rootRank), deadline);
        copy_into(store_->get(tensor_key), tensors[index]);
      }
    }
    forget_when_all_read(key, {key + "/"}, tensors.size());
    return completed(tensors);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) override {
    TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize()),
                "xagg: allgather of one tensor into world-size tensors");
    std::string key = next_key("allgather");
    store_->set(key + "/" + std::to_string(getRank()), bytes_of(inputs[0]));
    await_keys(every_rank(key), "all_gather", Clock::now() + timeout_);
    for (int rank = 0; rank < getSize(); ++rank) copy_into(store_->get(key + "/" + std::to_string(rank)), outputs[0][rank]);
    forget_when_all_read(key, {key + "/"}, static_cast<size_t>(getSize()));
    return completed(outputs[0]);
  }

  // all_gather_into_tensor: the output's rows, one per rank.
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& options) override {
    TORCH_CHECK(output.is_contiguous() && output.scalar_type() == input.scalar_type() &&
                    output.numel() == input.numel() * getSize(),
                "xagg: all_gather_into_tensor needs a contiguous output of the input's dtype and world size times "
                "its elements");
    std::vector<std::vector<at::Tensor>> rows(1);
    for (const at::Tensor& row : output.view({getSize(), -1}).unbind()) rows[0].push_back(row);
    std::vector<at::Tensor> inputs{input.contiguous().view(-1)};
    allgather(rows, inputs, options);
    return completed({output});
  }

  // gather, scatter and all_to_all move no reduction: they go through the
  // store (a TCP side channel), as allgather and broadcast do.
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& options) override {
    const bool root = getRank() == options.rootRank;
    TORCH_CHECK(inputs.size() == 1 && (root ? outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize())
                                            : outputs.empty() || outputs[0].empty()),
                "xagg: gather of one tensor into world-size tensors at the root (none elsewhere)");
    std::string key = next_key("gather");
    store_->set(key + "/" + std::to_string(getRank()), bytes_of(inputs[0]));
    if (root) {
      await_keys(every_rank(key), "gather", Clock::now() + timeout_);
      for (int rank = 0; rank < getSize(); ++rank) copy_into(store_->get(key + "/" + std::to_string(rank)), outputs[0][rank]);
    }
    forget_when_all_read(key, {key + "/"}, static_cast<size_t>(getSize()));
    return completed(root ? outputs[0] : inputs);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& options) override {
    const bool root = getRank() == options.rootRank;
    TORCH_CHECK(outputs.size() == 1 && (root ? inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize())
                                             : inputs.empty() || inputs[0].empty()),
                "xagg: scatter of world-size tensors from the root (none elsewhere) into one tensor");
    std::string key = next_key("scatter");
    if (root)
      for (int rank = 0; rank < getSize(); ++rank) store_->set(key + "/" + std::to_string(rank), bytes_of(inputs[0][rank]));
    const std::string own_key = key + "/" + std::to_string(getRank());
    await_keys({{own_key, static_cast<int>(options.rootRank)}}, fmt::format("scatter from rank {}", options.rootRank),
               Clock::now() + timeout_);
    copy_into(store_->get(own_key), outputs[0]);
    forget_when_all_read(key, {key + "/"}, static_cast<size_t>(getSize()));
    return completed(outputs);
  }

  // all_to_all: tensor d of `inputs` goes to rank d, whose output s it becomes.
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    const auto size = static_cast<size_t>(getSize());
    TORCH_CHECK(inputs.size() == size && outputs.size() == size, "xagg: all_to_all of world-size tensor lists");
    std::string key = next_key("alltoall");
    auto slot = [&](int source, int destination) {
      return key + "/" + std::to_string(source) + "/" + std::to_string(destination);
    };
    for (int destination = 0; destination < getSize(); ++destination)
      store_->set(slot(getRank(), destination), bytes_of(inputs[destination]));
    std::vector<StoreKey> incoming;
    for (int source = 0; source < getSize(); ++source) incoming.push_back({slot(source, getRank()), source});
    await_keys(incoming, "all_to_all", Clock::now() + timeout_);
    for (int source = 0; source < getSize(); ++source) copy_into(store_->get(slot(source, getRank())), outputs[source]);
    std::vector<std::string> prefixes;
    for (int source = 0; source < getSize(); ++source) prefixes.push_back(key + "/" + std::to_string(source) + "/");
    forget_when_all_read(key, prefixes, size);
    return completed(outputs);
  }

  // all_to_all_single: the rows of input and output, split by the sizes given (empty: equally).
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& options) override {
    std::vector<at::Tensor> outputs = split_rows(output, output_splits, "output");
    std::vector<at::Tensor> inputs = split_rows(input, input_splits, "input");
    alltoall(outputs, inputs, options);
    return completed({output});
  }

  // Point to point through the store (a TCP side channel): a send returns
  // once the store holds the tensor; a recv returns a pending Work at once,
  // completed by the receiver thread when the tensor is there, so that any
  // order of sends and receives that works with Gloo works here.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int destination, int tag) override {
    TORCH_CHECK(tensors.size() == 1, "xagg: one tensor per send");
    store_->set(point_to_point_key(getRank(), destination, tag), bytes_of(tensors[0]));
    return completed(tensors);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int source, int tag) override {
    TORCH_CHECK(tensors.size() == 1, "xagg: one tensor per recv");
    Receive receive{{point_to_point_key(source, getRank(), tag), source}, fmt::format("recv from rank {} (tag {})", source, tag),
                    tensors[0], c10::make_intrusive<XaggWork>(tensors), Clock::now() + timeout_};
    auto work = receive.work;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      TORCH_CHECK(!stopping_, "xagg: the process group was shut down");
      posted_.push_back(std::move(receive));
    }
    receive_posted_.notify_all();
    return work;
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    // Also orders the barrier after every all-reduce this rank queued before it.
    std::vector<at::Tensor> token = {at::ones({1}, at::kInt)};
    return allreduce(token, c10d::AllreduceOptions());
  }

 private:
  struct Pending {
    std::vector<std::shared_ptr<xagg::Work>> works;
    // In order, once every work succeeded: results of a 32-bit copy written
    // into the caller's tensor, reductions through the store.
    std::vector<std::function<void()>> then;
    c10::intrusive_ptr<XaggWork> work;
  };

  // A store key and the rank that writes it.
  struct StoreKey {
    std::string key;
    int writer;
  };

  struct Receive {
    StoreKey from;
    std::string what;
    at::Tensor tensor;
    c10::intrusive_ptr<XaggWork> work;
    Clock::time_point deadline;
  };

  // One Work for the all-reduces of these tensors, each in turn.
  c10::intrusive_ptr<c10d::Work> queue_allreduces(std::vector<at::Tensor>& tensors, const c10d::ReduceOp& reduce) {
    Pending pending{{}, {}, c10::make_intrusive<XaggWork>(tensors)};
    for (at::Tensor& tensor : tensors) {
      if (through_aggregators(tensor.scalar_type(), reduce)) add_allreduce(pending, tensor, reduce);
      else add_store_allreduce(pending, tensor, reduce);
    }
    return queue(std::move(pending));
  }

  c10::intrusive_ptr<c10d::Work> queue(Pending pending) {
    auto work = pending.work;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      TORCH_CHECK(!stopping_, "xagg: the process group was shut down");
      pending_.push_back(std::move(pending));
    }
    queued_.notify_all();
    return work;
  }

  // What the aggregators reduce: SUM, AVG, MAX and MIN of float32 (within the
  // quantization bound), of float16 and bfloat16 through float32, and of the
  // integers up to 64 bits, exactly. float64 would lose its bits in 32.
  static bool through_aggregators(at::ScalarType type, c10d::ReduceOp::RedOpType op) {
    const bool dtype = type == at::kFloat || type == at::kHalf || type == at::kBFloat16 || type == at::kInt ||
                       type == at::kLong || narrow_integer(type);
    return dtype && (op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG || op == c10d::ReduceOp::MAX ||
                     op == c10d::ReduceOp::MIN);
  }

  // Integers that go through an int32 copy (as_32bit).
  static bool narrow_integer(at::ScalarType type) {
    return type == at::kByte || type == at::kChar || type == at::kShort;
  }

  static void check_reducible(const at::Tensor& tensor, const char* collective) {
    TORCH_CHECK(tensor.device().is_cpu() && tensor.is_contiguous(), "xagg: ", collective,
                " of a contiguous CPU tensor");
  }

  static void check_average(at::ScalarType type, c10d::ReduceOp::RedOpType op, const char* collective) {
    TORCH_CHECK(op != c10d::ReduceOp::AVG || at::isFloatingType(type), "xagg: AVG of an integer tensor would "
                "truncate; ", collective, " with SUM and divide as you need");
  }

  // float16 and bfloat16 go through a float32 copy, quantized like float32
  // on the 16-bit wire (half_wire_bits), and are rounded back once the result
  // is in; float32 at the job's width; int64 through int32 limbs, exactly
  // (add_int64_allreduce). wire_bits: the width asked for, 0 for the dtype's.
  void add_allreduce(Pending& pending, at::Tensor& tensor, c10d::ReduceOp::RedOpType reduce, uint32_t wire_bits = 0) {
    check_reducible(tensor, "all-reduce");
    check_average(tensor.scalar_type(), reduce, "all-reduce");
    const xagg::ReduceOp op = reduce_op(reduce);
    if (tensor.scalar_type() == at::kLong) return add_int64_allreduce(pending, tensor, op);
    if (wire_bits == 0) wire_bits = default_wire_bits(tensor.scalar_type());
    at::Tensor reduced = as_32bit(pending, tensor);
    add_32bit_allreduces(pending.works, reduced, op, wire_bits);
  }

  // 0: the job's (CommunicatorConfig::wire_bits).
  uint32_t default_wire_bits(at::ScalarType type) const {
    return type == at::kHalf || type == at::kBFloat16 ? half_wire_bits_ : 0;
  }

  // The tensor itself, or a copy written back once the result is in: float32
  // for float16 and bfloat16, int32 for the narrower integers (whose SUM then
  // wraps as theirs does when it is narrowed back).
  static at::Tensor as_32bit(Pending& pending, at::Tensor& tensor) {
    const at::ScalarType type = tensor.scalar_type();
    if (type != at::kHalf && type != at::kBFloat16 && !narrow_integer(type)) return tensor;
    at::Tensor reduced = tensor.to(narrow_integer(type) ? at::kInt : at::kFloat);
    pending.then.push_back([reduced, tensor]() mutable { tensor.copy_(reduced); });
    return reduced;
  }

  // What the aggregators cannot reduce exactly (float64; PRODUCT and the
  // bitwise ops) goes through the store: every rank's tensor to every rank,
  // each reducing them in rank order, so that all get the same result, exact
  // to the dtype's own arithmetic. N times the bytes of the tensor per rank.
  void add_store_allreduce(Pending& pending, at::Tensor& tensor, c10d::ReduceOp::RedOpType op) {
    check_reducible(tensor, "all-reduce");
    check_average(tensor.scalar_type(), op, "all-reduce");
    const at::ScalarType type = tensor.scalar_type();
    const bool arithmetic = op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG || op == c10d::ReduceOp::MAX ||
                            op == c10d::ReduceOp::MIN || op == c10d::ReduceOp::PRODUCT;
    const bool bitwise = op == c10d::ReduceOp::BAND || op == c10d::ReduceOp::BOR || op == c10d::ReduceOp::BXOR;
    TORCH_CHECK((type == at::kDouble && arithmetic) || (op == c10d::ReduceOp::PRODUCT && !at::isComplexType(type)) ||
                    (bitwise && at::isIntegralType(type, /*includeBool=*/true)),
                "xagg: all-reduce of ", type, " with ", op_name(op), " is not supported (the ops are SUM, AVG, MAX, "
                "MIN and PRODUCT, and BAND, BOR and BXOR of integer and bool tensors)");
    const std::string key = next_key("allreduce");
    pending.then.push_back([this, key, tensor, op]() mutable {
      store_->set(key + "/" + std::to_string(getRank()), bytes_of(tensor));
      await_keys(every_rank(key), fmt::format("all_reduce {}", op_name(op)), Clock::now() + timeout_);
      at::Tensor result = at::empty_like(tensor);
      copy_into(store_->get(key + "/0"), result);
      at::Tensor contribution = at::empty_like(tensor);
      for (int rank = 1; rank < getSize(); ++rank) {
        copy_into(store_->get(key + "/" + std::to_string(rank)), contribution);
        combine(result, contribution, op);
      }
      if (op == c10d::ReduceOp::AVG) result.div_(getSize());
      tensor.copy_(result);
      forget_when_all_read(key, {key + "/"}, static_cast<size_t>(getSize()));
    });
  }

  static void combine(at::Tensor& result, const at::Tensor& contribution, c10d::ReduceOp::RedOpType op) {
    switch (op) {
      case c10d::ReduceOp::SUM:
      case c10d::ReduceOp::AVG: result.add_(contribution); break;
      case c10d::ReduceOp::PRODUCT: result.mul_(contribution); break;
      case c10d::ReduceOp::MAX: result = at::maximum(result, contribution); break;
      case c10d::ReduceOp::MIN: result = at::minimum(result, contribution); break;
      case c10d::ReduceOp::BAND: result.bitwise_and_(contribution); break;
      case c10d::ReduceOp::BOR: result.bitwise_or_(contribution); break;
      case c10d::ReduceOp::BXOR: result.bitwise_xor_(contribution); break;
      default: TORCH_CHECK(false, "xagg: all-reduce with ", op_name(op), " is not supported");
    }
  }

  static const char* op_name(c10d::ReduceOp::RedOpType op) {
    switch (op) {
      case c10d::ReduceOp::SUM: return "SUM";
      case c10d::ReduceOp::AVG: return "AVG";
      case c10d::ReduceOp::PRODUCT: return "PRODUCT";
      case c10d::ReduceOp::MIN: return "MIN";
      case c10d::ReduceOp::MAX: return "MAX";
      case c10d::ReduceOp::BAND: return "BAND";
      case c10d::ReduceOp::BOR: return "BOR";
      case c10d::ReduceOp::BXOR: return "BXOR";
      case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
      default: return "an unknown ReduceOp";
    }
  }

  // As all-reduce, shard by shard (Communicator::reduce_scatter_async), in
  // pieces of the job's size. int64 is refused: its MAX and MIN would need
  // every shard's high words on every rank, and its SUM triples the bytes.
  c10::intrusive_ptr<c10d::Work> queue_reduce_scatter(at::Tensor& output, std::vector<at::Tensor>& shards,
                                                      const c10d::ReduceOp& reduce) {
    TORCH_CHECK(through_aggregators(output.scalar_type(), reduce) && output.scalar_type() != at::kLong,
                "xagg: reduce_scatter of ", output.scalar_type(), " with ", op_name(reduce), " is not supported: "
                "SUM, AVG, MAX or MIN of float32, float16, bfloat16 or the integers up to int32; all_reduce it");
    xagg::ReduceOp op = reduce_op(reduce);
    check_reducible(output, "reduce_scatter");
    check_average(output.scalar_type(), reduce, "reduce_scatter");
    for (const at::Tensor& shard : shards)
      TORCH_CHECK(shard.scalar_type() == output.scalar_type() && shard.numel() == output.numel(),
                  "xagg: reduce_scatter needs every input of the output's dtype and size (", output.numel(),
                  " elements)");
    Pending pending{{}, {}, c10::make_intrusive<XaggWork>(std::vector<at::Tensor>{output})};
    at::Tensor reduced = as_32bit(pending, output);
    std::vector<at::Tensor> inputs;  // read before reduce_scatter_async returns
    for (const at::Tensor& shard : shards) inputs.push_back(shard.to(reduced.scalar_type()).contiguous());
    const uint32_t wire_bits = default_wire_bits(output.scalar_type());
    const int64_t piece = piece_elements(reduced.scalar_type(), wire_bits);
    for (int64_t begin = 0; begin < reduced.numel(); begin += piece) {
      size_t count = std::min(piece, reduced.numel() - begin);
      if (reduced.scalar_type() == at::kInt)
        pending.works.push_back(open_communicator().reduce_scatter_async(
            shard_pointers<int32_t>(inputs, begin), reduced.data_ptr<int32_t>() + begin, count, op));
      else
        pending.works.push_back(open_communicator().reduce_scatter_async(
            shard_pointers<float>(inputs, begin), reduced.data_ptr<float>() + begin, count, op, wire_bits));
    }
    return queue(std::move(pending));
  }

  template <class T>
  static std::vector<const T*> shard_pointers(std::vector<at::Tensor>& shards, int64_t begin) {
    std::vector<const T*> pointers;
    for (at::Tensor& shard : shards) pointers.push_back(shard.data_ptr<T>() + begin);
    return pointers;
  }

  // Tensors beyond what one all-reduce holds go out as several, in order.
  void add_32bit_allreduces(std::vector<std::shared_ptr<xagg::Work>>& works, at::Tensor& reduced, xagg::ReduceOp op,
                            uint32_t wire_bits = 0) {
    const int64_t piece = piece_elements(reduced.scalar_type(), wire_bits);
    for (int64_t begin = 0; begin < reduced.numel(); begin += piece) {
      size_t count = std::min(piece, reduced.numel() - begin);
      if (reduced.scalar_type() == at::kInt)
        works.push_back(open_communicator().allreduce_async(reduced.data_ptr<int32_t>() + begin, count, op));
      else
        works.push_back(open_communicator().allreduce_async(reduced.data_ptr<float>() + begin, count, op, wire_bits));
    }
  }

  // The largest all-reduce of the type at the width (Communicator::max_allreduce_elements).
  int64_t piece_elements(at::ScalarType reduced_type, uint32_t wire_bits) {
    return static_cast<int64_t>(open_communicator().max_allreduce_elements(reduced_type == at::kInt ? 32 : wire_bits));
  }

  // int64, exactly. SUM: three int32 limbs per element (22, 22 and a signed
  // 20 bits), whose sums over at most 64 ranks fit in int32; the result is
  // recombined modulo 2^64, as an int64 sum wraps. MAX and MIN (MIN as the
  // MAX of complements): the MAX of the high words first, waited for here,
  // then the MAX of the low words of the ranks that hold that high word.
  void add_int64_allreduce(Pending& pending, at::Tensor& tensor, xagg::ReduceOp op) {
    const int64_t count = tensor.numel();
    auto* values = tensor.data_ptr<int64_t>();
    if (op == xagg::ReduceOp::Sum) {
      at::Tensor limbs = at::empty({3 * count}, tensor.options().dtype(at::kInt));
      auto* limb = limbs.data_ptr<int32_t>();
      for (int64_t i = 0; i < count; ++i) {
        const auto value = static_cast<uint64_t>(values[i]);
        limb[i] = static_cast<int32_t>(value & kLimbMask);
        limb[count + i] = static_cast<int32_t>((value >> kLimbBits) & kLimbMask);
        limb[2 * count + i] = static_cast<int32_t>(values[i] >> (2 * kLimbBits));  // arithmetic: signed
      }
      pending.then.push_back([limbs, tensor, count]() mutable {
        const auto* sum = limbs.data_ptr<int32_t>();
        auto* out = tensor.data_ptr<int64_t>();
        for (int64_t i = 0; i < count; ++i)
          out[i] = static_cast<int64_t>(static_cast<uint64_t>(static_cast<int64_t>(sum[i])) +
                                        (static_cast<uint64_t>(static_cast<int64_t>(sum[count + i])) << kLimbBits) +
                                        (static_cast<uint64_t>(static_cast<int64_t>(sum[2 * count + i]))
                                         << (2 * kLimbBits)));
      });
      return add_32bit_allreduces(pending.works, limbs, xagg::ReduceOp::Sum);
    }
    const bool minimum = op == xagg::ReduceOp::Min;
    auto key = [minimum](int64_t value) { return minimum ? ~value : value; };  // ~ reverses the order
    at::Tensor high = at::empty({count}, tensor.options().dtype(at::kInt));
    auto* high_word = high.data_ptr<int32_t>();
    for (int64_t i = 0; i < count; ++i) high_word[i] = static_cast<int32_t>(key(values[i]) >> 32);
    std::vector<std::shared_ptr<xagg::Work>> high_works;
    add_32bit_allreduces(high_works, high, xagg::ReduceOp::Max);
    for (auto& work : high_works) work->wait();
    // Low words as unsigned order in int32 (flip the top bit); INT32_MIN where this rank's high word lost.
    at::Tensor low = at::empty({count}, tensor.options().dtype(at::kInt));
    auto* low_word = low.data_ptr<int32_t>();
    for (int64_t i = 0; i < count; ++i)
      low_word[i] = static_cast<int32_t>(key(values[i]) >> 32) == high_word[i]
                        ? static_cast<int32_t>(static_cast<uint32_t>(key(values[i])) ^ 0x80000000u)
                        : INT32_MIN;
    pending.then.push_back([high, low, tensor, count, minimum]() mutable {
      const auto* top = high.data_ptr<int32_t>();
      const auto* bottom = low.data_ptr<int32_t>();
      auto* out = tensor.data_ptr<int64_t>();
      for (int64_t i = 0; i < count; ++i) {
        const int64_t joined = static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>(top[i])) << 32) |
                                                    (static_cast<uint32_t>(bottom[i]) ^ 0x80000000u));
        out[i] = minimum ? ~joined : joined;
      }
    });
    add_32bit_allreduces(pending.works, low, xagg::ReduceOp::Max);
  }

  // libxagg completes all-reduces in call order; so are their futures, from
  // this thread. A Pending dies here, outside the lock: freeing a tensor that
  // Python owns takes the GIL.
  void complete_in_order() {
    while (true) {
      Pending pending;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        queued_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
        if (pending_.empty()) return;
        pending = std::move(pending_.front());
        pending_.pop_front();
      }
      std::exception_ptr error;
      try {
        for (auto& work : pending.works) work->wait();
        for (auto& step : pending.then) step();
      } catch (...) {
        error = std::current_exception();
      }
      pending.work->complete(error);
    }
  }

  // Completes each posted receive once its tensor is in the store, in any
  // order; fails those still waiting at shutdown (no rank needs them).
  void complete_receives() {
    std::vector<Receive> waiting;  // this thread's own
    auto pause = std::chrono::duration_cast<Clock::duration>(kFirstPoll);
    while (true) {
      bool stop = false;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        auto woken = [this] { return stopping_ || !posted_.empty(); };
        if (waiting.empty()) receive_posted_.wait(lock, woken);
        else receive_posted_.wait_for(lock, pause, woken);
        stop = stopping_;
        if (!posted_.empty()) pause = kFirstPoll;
        for (Receive& receive : posted_) waiting.push_back(std::move(receive));
        posted_.clear();
      }
      std::vector<Receive> still_waiting;
      for (Receive& receive : waiting) {
        try {
          if (stop) throw std::runtime_error(fmt::format("xagg: {}: the process group was shut down first",
                                                         receive.what));
          std::vector<StoreKey> missing{receive.from};
          drop_written(missing, receive.what, receive.deadline);
          if (!missing.empty()) {
            still_waiting.push_back(std::move(receive));
            continue;
          }
          copy_into(store_->get(receive.from.key), receive.tensor);
          store_->deleteKey(receive.from.key);
          receive.work->complete(nullptr);
        } catch (...) {
          receive.work->complete(std::current_exception());
        }
      }
      if (still_waiting.size() == waiting.size()) pause = std::min<Clock::duration>(2 * pause, kLastPoll);
      waiting = std::move(still_waiting);  // the completed die here, outside the lock
      if (stop) return;
    }
  }

  // Waits until the store holds every key (await_keys's deadline is the caller's).
  void await_keys(std::vector<StoreKey> keys, const std::string& what, Clock::time_point deadline) {
    auto pause = std::chrono::duration_cast<Clock::duration>(kFirstPoll);
    while (true) {
      drop_written(keys, what, deadline);
      if (keys.empty()) return;
      std::this_thread::sleep_for(pause);
      pause = std::min<Clock::duration>(2 * pause, kLastPoll);
    }
  }

  // Drops the keys the store holds. Of those still missing, names the ranks
  // that would write them once the group's job has failed (the aggregator
  // reports a rank gone at once) or past the deadline.
  void drop_written(std::vector<StoreKey>& keys, const std::string& what, Clock::time_point deadline) {
    // Read before the store: what a rank wrote before it left still counts.
    std::string failure = job_failure();
    keys.erase(std::remove_if(keys.begin(), keys.end(), [this](const StoreKey& key) { return store_->check({key.key}); }),
               keys.end());
    if (keys.empty()) return;
    std::vector<int> writers;
    for (const StoreKey& key : keys) writers.push_back(key.writer);
    const std::string ranks = fmt::format("rank{} {}", writers.size() == 1 ? "" : "s", fmt::join(writers, ", "));
    if (!failure.empty()) throw std::runtime_error(fmt::format("xagg: {} failed waiting for {}: {}", what, ranks, failure));
    if (Clock::now() >= deadline)
      throw std::runtime_error(fmt::format("xagg: {} timed out after {} ms (the group's timeout) waiting for {}", what,
                                           timeout_.count(), ranks));
  }

  // The error that fails the group's job, or empty.
  std::string job_failure() {
    try {
      open_communicator().throw_if_failed();
      return {};
    } catch (const std::exception& error) {
      return error.what();
    }
  }

  std::vector<StoreKey> every_rank(const std::string& key) {
    std::vector<StoreKey> keys;
    for (int rank = 0; rank < getSize(); ++rank) keys.push_back({key + "/" + std::to_string(rank), rank});
    return keys;
  }

  static xagg::ReduceOp reduce_op(c10d::ReduceOp::RedOpType op) {
    switch (op) {
      case c10d::ReduceOp::SUM: return xagg::ReduceOp::Sum;
      case c10d::ReduceOp::AVG: return xagg::ReduceOp::Average;
      case c10d::ReduceOp::MAX: return xagg::ReduceOp::Max;
      case c10d::ReduceOp::MIN: return xagg::ReduceOp::Min;
      default: TORCH_CHECK(false, "xagg: the aggregators reduce with SUM, AVG, MAX or MIN, not ", op_name(op));
    }
  }

  xagg::Communicator& open_communicator() {
    TORCH_CHECK(communicator_, "xagg: the process group was shut down");
    return *communicator_;
  }

  // Sender and receiver number the messages of each (source, destination, tag) alike.
  std::string point_to_point_key(int source, int destination, int tag) {
    uint64_t number = point_to_point_sent_[{source, destination, tag}]++;
    return "xagg/p2p/" + std::to_string(source) + "/" + std::to_string(destination) + "/" + std::to_string(tag) + "/" +
           std::to_string(number);
  }

  // A tensor's rows in getSize() consecutive views of `splits` rows each (empty: equal shares).
  std::vector<at::Tensor> split_rows(at::Tensor& tensor, const std::vector<int64_t>& splits, const char* which) {
    TORCH_CHECK(tensor.is_contiguous(), "xagg: all_to_all_single needs a contiguous ", which);
    const int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
    std::vector<int64_t> counts = splits;
    if (counts.empty()) {
      TORCH_CHECK(rows % getSize() == 0, "xagg: all_to_all_single ", which, " of ", rows,
                  " rows does not split equally over ", getSize(), " ranks");
      counts.assign(static_cast<size_t>(getSize()), rows / getSize());
    }
    TORCH_CHECK(counts.size() == static_cast<size_t>(getSize()) &&
                    std::accumulate(counts.begin(), counts.end(), int64_t{0}) == rows,
                "xagg: all_to_all_single ", which, " split sizes must be one per rank and add up to its ", rows, " rows");
    std::vector<at::Tensor> parts;
    int64_t start = 0;
    for (int64_t count : counts) {
      parts.push_back(tensor.narrow(0, start, count));
      start += count;
    }
    return parts;
  }

  std::string next_key(const char* collective) { return std::string("xagg/") + collective + "/" + std::to_string(sequence_++); }

  static std::vector<uint8_t> bytes_of(const at::Tensor& tensor) {
    at::Tensor contiguous = tensor.contiguous();
    auto* begin = static_cast<const uint8_t*>(contiguous.data_ptr());
    return {begin, begin + contiguous.nbytes()};
  }

  static void copy_into(const std::vector<uint8_t>& bytes, at::Tensor& tensor) {
    TORCH_CHECK(bytes.size() == tensor.nbytes(), "xagg: tensor sizes differ between ranks");
    at::Tensor source = at::from_blob(const_cast<uint8_t*>(bytes.data()), tensor.sizes(), tensor.options());
    tensor.copy_(source);
  }

  // The last rank to read a collective's keys deletes them, so the store does not grow.
  void forget_when_all_read(const std::string& key, const std::vector<std::string>& prefixes, size_t count) {
    if (store_->add(key + "/read", 1) < getSize()) return;
    for (const auto& prefix : prefixes)
      for (size_t index = 0; index < count; ++index) store_->deleteKey(prefix + std::to_string(index));
    store_->deleteKey(key + "/read");
  }

  static c10::intrusive_ptr<c10d::Work> completed(const std::vector<at::Tensor>& tensors) {
    auto work = c10::make_intrusive<XaggWork>(tensors);
    work->complete(nullptr);
    return work;
  }

  c10::intrusive_ptr<c10d::Store> store_;
  uint32_t half_wire_bits_;  // float16 and bfloat16 tensors' width on the wire
  std::chrono::milliseconds timeout_;
  uint64_t sequence_ = 0;  // every rank issues the same store collectives in the same order
  std::map<std::tuple<int, int, int>, uint64_t> point_to_point_sent_;
  std::unique_ptr<xagg::Communicator> communicator_;
  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<Pending> pending_;
  std::condition_variable receive_posted_;
  std::vector<Receive> posted_;
  bool stopping_ = false;
  std::thread completer_;
  std::thread receiver_;
};

// libxagg's log level; an unknown name is refused rather than read as "off".
void set_log_level(const std::string& name) {
  spdlog::level::level_enum level = spdlog::level::from_str(name);
  TORCH_CHECK(level != spdlog::level::off || name == "off",
              "xagg: XAGG_LOG_LEVEL '", name, "' is not one of trace, debug, info, warning, error, critical, off");
  spdlog::set_level(level);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.doc() = "XAgg c10d process group (libxagg)";
  module.def("set_log_level", &set_log_level, py::arg("name"));
  py::class_<ProcessGroupXagg, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupXagg>>(module, "ProcessGroupXagg")
      .def(py::init<c10::intrusive_ptr<c10d::Store>, int, int, const std::vector<std::string>&,
                    const std::vector<uint32_t>&, uint32_t, uint64_t, std::chrono::milliseconds, const std::string&, uint32_t,
                    std::chrono::milliseconds, const std::string&, uint32_t, uint32_t, uint32_t>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("aggregators"), py::arg("aggregator_weights"),
           py::arg("job_id"), py::arg("max_elements"), py::arg("timeout"), py::arg("secret_file"), py::arg("mtu"),
           py::arg("aggregator_dead_after"), py::arg("root_aggregator"), py::arg("ranks_per_leaf"),
           py::arg("wire_bits"), py::arg("half_wire_bits"), py::call_guard<py::gil_scoped_release>())
      .def("allreduce_on_wire", &ProcessGroupXagg::allreduce_on_wire, py::arg("tensor"), py::arg("op"),
           py::arg("wire_bits"), py::call_guard<py::gil_scoped_release>())
      .def("begin_step", &ProcessGroupXagg::begin_step, py::call_guard<py::gil_scoped_release>())
      .def("shutdown", &ProcessGroupXagg::shutdown, py::call_guard<py::gil_scoped_release>());
}
