// Turns sampler batches into libtorch tensors (the only part of the data layer that needs torch).
#pragma once
#include <torch/torch.h>

#include "shardtrain/data/sampler.h"

namespace shardtrain::data {

// A target that does not count (a prompt token of instruction data): the cross-entropy's
// default ignore_index, so the loss functions skip it.
inline constexpr std::int64_t kIgnoredTarget = -100;

struct TokenTensors {
  torch::Tensor inputs;   // int64 [B, T]: tokens 0..T-1 of each window
  torch::Tensor targets;  // int64 [B, T]: tokens 1..T (inputs shifted by one); kIgnoredTarget
                          // where the batch's mask says the target does not count
};
TokenTensors to_tensors(const TokenBatch& b);

struct ImageTensors {
  torch::Tensor images;  // float32 [B, C, H, W], (x/255 - mean) / std
  torch::Tensor labels;  // int64 [B]
};
// MNIST's usual normalisation constants.
inline constexpr float kMnistMean = 0.1307f, kMnistStd = 0.3081f;
ImageTensors to_tensors(const ImageBatch& b, float mean = kMnistMean, float stddev = kMnistStd);

}  // namespace shardtrain::data
