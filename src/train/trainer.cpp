#include "trainer.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include "fashion_mnist.h"
#include "gradient_buckets.h"

namespace xagg::train {
namespace {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

// The models, built in registration order from the seed, so that every rank
// starts from the same weights. No dropout or batch norm: a rank's result then
// depends only on the averaged gradient, as in a single process.
// "cnn": two convolutions and two linear layers (225,034 parameters), compute-bound.
// "mlp": 784 -> hidden -> hidden -> 10 (11.4 M parameters at hidden 3000), whose
// gradient is large beside its compute: communication-bound.
torch::nn::Sequential make_model(const TrainConfig& config) {
  namespace nn = torch::nn;
  if (config.model == "mlp")
    return nn::Sequential(nn::Flatten(), nn::Linear(28 * 28, config.hidden), nn::ReLU(),
                          nn::Linear(config.hidden, config.hidden), nn::ReLU(), nn::Linear(config.hidden, 10));
  if (config.model != "cnn") throw std::invalid_argument("--model " + config.model + ": use cnn or mlp");
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 32, 3)), nn::ReLU(), nn::MaxPool2d(2),  // 28 -> 26 -> 13
                        nn::Conv2d(nn::Conv2dOptions(32, 64, 3)), nn::ReLU(), nn::MaxPool2d(2),  // 13 -> 11 -> 5
                        nn::Flatten(), nn::Linear(64 * 5 * 5, 128), nn::ReLU(), nn::Linear(128, 10));
}

struct Split {
  torch::Tensor images;  // N x 1 x 28 x 28, normalized
  torch::Tensor labels;  // N, int64
};

Split load_split(const std::filesystem::path& root, torch::data::datasets::MNIST::Mode mode, uint32_t limit) {
  torch::data::datasets::MNIST dataset(root.string(), mode);
  int64_t count = limit == 0 ? dataset.images().size(0) : std::min<int64_t>(limit, dataset.images().size(0));
  // Fashion-MNIST's training-set mean and standard deviation.
  return {(dataset.images().narrow(0, 0, count) - 0.2860) / 0.3530, dataset.targets().narrow(0, 0, count)};
}

// The parameters' gradients as views into one flat buffer, in reverse
// registration order, so that each bucket is one contiguous range.
struct FlatGradients {
  explicit FlatGradients(const std::vector<torch::Tensor>& params) {
    int64_t total = 0;
    for (const auto& param : params) total += param.numel();
    buffer = torch::zeros({total});
    int64_t offset = 0;
    for (auto param = params.rbegin(); param != params.rend(); ++param) {
      param->mutable_grad() = buffer.narrow(0, offset, param->numel()).view(param->sizes());
      sizes.push_back(static_cast<size_t>(param->numel()));
      offset += param->numel();
    }
  }
  torch::Tensor buffer;
  std::vector<size_t> sizes;  // flat-buffer order
};

// Calls the reducer when a parameter's gradient has been accumulated (a post
// hook on its AccumulateGrad node, as DDP registers them).
std::vector<std::shared_ptr<torch::autograd::Node>> hook_gradients(const std::vector<torch::Tensor>& params,
                                                                   BucketReducer& reducer) {
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  for (size_t index = 0; index < params.size(); ++index) {
    size_t flat_index = params.size() - 1 - index;
    auto accumulator = torch::autograd::impl::grad_accumulator(params[index]);
    accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [&reducer, flat_index](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          reducer.mark_ready(flat_index);
          return outputs;
        }));
    accumulators.push_back(std::move(accumulator));  // the hooks live on these nodes
  }
  return accumulators;
}

struct Evaluation {
  double accuracy = 0;  // percent
  double loss = 0;
};

Evaluation evaluate(torch::nn::Sequential& model, const Split& test) {
  torch::NoGradGuard no_grad;
  int64_t correct = 0;
  double loss = 0;
  for (int64_t begin = 0; begin < test.images.size(0); begin += 1000) {
    int64_t count = std::min<int64_t>(1000, test.images.size(0) - begin);
    auto logits = model->forward(test.images.narrow(0, begin, count));
    auto labels = test.labels.narrow(0, begin, count);
    loss += torch::nn::functional::cross_entropy(
                logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                .item<double>();
    correct += logits.argmax(1).eq(labels).sum().item<int64_t>();
  }
  auto samples = static_cast<double>(test.images.size(0));
  return {100.0 * correct / samples, loss / samples};
}

void emit(std::ostream& events, const nlohmann::json& event) { events << event.dump() << std::endl; }

}  // namespace

void train_rank(const TrainConfig& config, uint32_t rank, const BackendFactory& connect, std::ostream& events) {
  // launch_training validates the options up front; these hold a rank started by hand to them too.
  if (config.world_size == 0 || config.batch_size < config.world_size || config.batch_size % config.world_size != 0)
    throw std::invalid_argument("the global batch size must be a positive multiple of the number of workers");
  torch::set_num_threads(static_cast<int>(config.threads));
  auto root = decompressed_fashion_mnist(config.data_dir, config.cache_dir);
  Split train = load_split(root, torch::data::datasets::MNIST::Mode::kTrain, config.train_samples);
  std::optional<Split> test;
  if (rank == 0) test = load_split(root, torch::data::datasets::MNIST::Mode::kTest, config.test_samples);

  torch::manual_seed(config.seed);  // the same initial weights on every rank
  torch::nn::Sequential model = make_model(config);
  std::vector<torch::Tensor> params = model->parameters();
  FlatGradients gradients(params);
  std::unique_ptr<backends::Backend> backend;
  std::optional<BucketReducer> reducer;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  if (connect) {
    backend = connect(static_cast<uint64_t>(gradients.buffer.numel()));
    reducer.emplace(*backend, gradients.buffer.data_ptr<float>(), make_buckets(gradients.sizes, config.bucket_elements));
    accumulators = hook_gradients(params, *reducer);
  }
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(config.learning_rate).momentum(config.momentum));

  const int64_t global_batch = config.batch_size;
  const int64_t local_batch = global_batch / config.world_size;
  const int64_t steps = train.images.size(0) / global_batch;  // the incomplete last batch is dropped
  if (steps == 0) throw std::invalid_argument("the global batch size exceeds the training samples");
  const double skew = config.compute_skew.empty() ? 1.0 : config.compute_skew.at(rank);
  emit(events, {{"event", "start"}, {"rank", rank}, {"steps_per_epoch", steps}, {"parameters", gradients.buffer.numel()},
                {"buckets", reducer ? reducer->bucket_count() : 0}, {"train_samples", train.images.size(0)}});

  const auto start = Clock::now();
  double training_seconds = 0;
  Seconds previous_compute{0};
  for (uint32_t epoch = 1; epoch <= config.epochs; ++epoch) {
    model->train();
    // Every rank draws the same permutation and takes its slice of each global batch.
    auto order = torch::randperm(train.images.size(0), torch::TensorOptions().dtype(torch::kLong));
    double loss_sum = 0, step_seconds = 0, busy_seconds = 0, exposed_seconds = 0;
    for (int64_t step = 0; step < steps; ++step) {
      auto step_start = Clock::now();
      auto indexes = order.narrow(0, step * global_batch + rank * local_batch, local_batch);
      gradients.buffer.zero_();
      auto loss = torch::nn::functional::cross_entropy(model->forward(train.images.index_select(0, indexes)),
                                                       train.labels.index_select(0, indexes));
      auto forward_end = Clock::now();
      if (skew > 1.0) std::this_thread::sleep_for((skew - 1.0) * previous_compute);
      auto backward_start = Clock::now();
      loss.backward();
      auto backward_end = Clock::now();
      if (reducer) reducer->finish_step();
      auto reduced = Clock::now();
      optimizer.step();
      previous_compute = (forward_end - step_start) + (backward_end - backward_start);
      loss_sum += loss.item<double>();
      step_seconds += Seconds(Clock::now() - step_start).count();
      exposed_seconds += Seconds(reduced - backward_end).count();
      if (reducer) busy_seconds += reducer->take_busy_seconds();
      if ((step + 1) % config.progress_every == 0 || step + 1 == steps)
        emit(events, {{"event", "progress"}, {"epoch", epoch}, {"step", step + 1}, {"steps", steps},
                      {"loss", loss_sum / static_cast<double>(step + 1)},
                      {"iteration_ms", 1e3 * step_seconds / static_cast<double>(step + 1)},
                      {"comm_share", busy_seconds / step_seconds}});
      // Outside the step's timing; the other ranks wait for rank 0 at the next all-reduce.
      if (test && config.eval_every > 0 && (step + 1) % config.eval_every == 0 && step + 1 < steps) {
        model->eval();
        Evaluation result = evaluate(model, *test);
        model->train();
        emit(events, {{"event", "evaluation"}, {"epoch", epoch}, {"step", step + 1},
                      {"test_accuracy", result.accuracy}, {"test_loss", result.loss},
                      {"wall_s", Seconds(Clock::now() - start).count()}});
      }
    }
    training_seconds += step_seconds;
    nlohmann::json summary = {{"event", "epoch"},
                              {"epoch", epoch},
                              {"train_loss", loss_sum / static_cast<double>(steps)},
                              {"iteration_ms", 1e3 * step_seconds / static_cast<double>(steps)},
                              {"comm_share", busy_seconds / step_seconds},
                              {"exposed_comm_share", exposed_seconds / step_seconds},
                              {"train_s", training_seconds}};
    if (test) {
      model->eval();
      Evaluation result = evaluate(model, *test);
      summary["test_accuracy"] = result.accuracy;
      summary["test_loss"] = result.loss;
    }
    summary["wall_s"] = Seconds(Clock::now() - start).count();
    emit(events, summary);
  }
  emit(events, {{"event", "done"}, {"wall_s", Seconds(Clock::now() - start).count()}});
}

}  // namespace xagg::train
