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
  // Rows apart (TokenBatch::rows_apart): each token's position in its row (int64 [B, T]), and
  // the rows' boundaries over the B x T tokens in order, flash attention's cu_seqlens: 0, the
  // end of each row (clipped to the window's T inputs) and of each window's padding, B x T.
  // Undefined / empty: one sequence per window, positions 0..T-1.
  torch::Tensor positions;
  std::vector<std::int64_t> cu_seqlens;
};
// Stream windows keep T = seq_len. Rows apart: the target at t is token t+1 only inside t's
// segment (a row's last token predicts nothing; padding none), and packed / padded batches are
// trimmed to their longest window (Hugging Face's padding to the longest), T <= seq_len.
TokenTensors to_tensors(const TokenBatch& b);

struct ImageTensors {
  torch::Tensor images;  // float32 [B, C, H, W], (x/255 - mean) / std
  torch::Tensor labels;  // int64 [B]
};
// MNIST's usual normalisation constants.
inline constexpr float kMnistMean = 0.1307f, kMnistStd = 0.3081f;
ImageTensors to_tensors(const ImageBatch& b, float mean = kMnistMean, float stddev = kMnistStd);

}  // namespace shardtrain::data
