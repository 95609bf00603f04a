// Sampler batches -> libtorch tensors (CPU; the trainer moves them to the device).
#include "shardtrain/data/batch_tensors.h"

namespace shardtrain::data {

TokenTensors to_tensors(const TokenBatch& b) {
  const std::int64_t w = b.seq_len + 1;
  auto all = torch::empty({b.batch, w}, torch::kInt32);
  std::copy(b.tokens.begin(), b.tokens.end(), all.data_ptr<std::int32_t>());
  all = all.to(torch::kInt64);
  using torch::indexing::Slice;
  torch::Tensor targets = all.index({Slice(), Slice(1, w)}).contiguous();
  if (!b.mask.empty()) {
    // A copy of its own: with one row the slice is already contiguous, and contiguous() would
    // return a view that shares the inputs' storage.
    targets = targets.clone();
    // Target t is token t+1: it counts iff mask[t+1] is 1.
    std::int64_t* t = targets.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < b.batch; ++i)
      for (std::int64_t p = 0; p < b.seq_len; ++p)
        if (b.mask[i * w + p + 1] == 0) t[i * b.seq_len + p] = kIgnoredTarget;
  }
  return {all.index({Slice(), Slice(0, b.seq_len)}).contiguous(), targets};
}

ImageTensors to_tensors(const ImageBatch& b, float mean, float stddev) {
  auto px = torch::empty({b.batch, b.channels, b.height, b.width}, torch::kUInt8);
  std::copy(b.pixels.begin(), b.pixels.end(), px.data_ptr<std::uint8_t>());
  auto images = (px.to(torch::kFloat32) / 255.0f - mean) / stddev;
  auto labels = torch::empty({b.batch}, torch::kUInt8);
  std::copy(b.labels.begin(), b.labels.end(), labels.data_ptr<std::uint8_t>());
  return {images, labels.to(torch::kInt64)};
}

}  // namespace shardtrain::data
