// One rank of data-parallel training: a small CNN on Fashion-MNIST, each rank
// computing the gradient of its share of every global batch, averaged through
// the backend in buckets while backward runs. The only translation unit that
// includes torch.
#pragma once

#include <functional>
#include <memory>
#include <ostream>

#include "backend.h"
#include "train_config.h"

namespace xagg::train {

// Connects to the other ranks once the model's size is known; null for a single process.
using BackendFactory = std::function<std::unique_ptr<backends::Backend>(uint64_t max_elements)>;

// Trains rank `rank` of config.world_size.
// Writes one JSON object per line to `events`: "start", "progress" every
// config.progress_every steps, on rank 0 "evaluation" every config.eval_every steps
// (test accuracy and loss, for time-to-accuracy within an epoch), "epoch" (rank 0 adds
// test accuracy and loss), "done".
void train_rank(const TrainConfig& config, uint32_t rank, const BackendFactory& connect, std::ostream& events);

}  // namespace xagg::train
