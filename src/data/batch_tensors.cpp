// Sampler batches -> libtorch tensors (CPU; the trainer moves them to the device).
#include "shardtrain/data/batch_tensors.h"

#include <algorithm>

namespace shardtrain::data {

namespace {
// Rows apart: inputs, targets by the segment rule, positions and cu_seqlens.
TokenTensors rows_to_tensors(const TokenBatch& b) {
  const std::int64_t w = b.seq_len + 1;
  // Packed / padded windows (their segments end by position T) are trimmed to the longest;
  // stream windows (a segment runs into token T, the last target) keep T.
  std::int64_t T = 1;
  for (std::int64_t i = 0, k = 0; i < b.batch; ++i) {
    std::int64_t used = 0;
    for (std::int32_t n = 0; n < b.segment_count[i]; ++n) used += b.segments[k++];
    T = std::max(T, std::min(used, b.seq_len));
  }
  TokenTensors out;
  out.inputs = torch::zeros({b.batch, T}, torch::kInt64);
  out.targets = torch::full({b.batch, T}, kIgnoredTarget, torch::kInt64);
  out.positions = torch::zeros({b.batch, T}, torch::kInt64);
  std::int64_t* in = out.inputs.data_ptr<std::int64_t>();
  std::int64_t* tg = out.targets.data_ptr<std::int64_t>();
  std::int64_t* pos = out.positions.data_ptr<std::int64_t>();
  out.cu_seqlens.push_back(0);
  for (std::int64_t i = 0, k = 0; i < b.batch; ++i) {
    const std::int32_t* tok = &b.tokens[i * w];
    const std::uint8_t* mask = b.mask.empty() ? nullptr : &b.mask[i * w];
    std::int64_t at = 0;
    for (std::int32_t n = 0; n < b.segment_count[i]; ++n) {
      const std::int64_t len = b.segments[k++], end = at + len;
      for (std::int64_t t = at; t < std::min(end, T); ++t) {
        in[i * T + t] = tok[t];
        pos[i * T + t] = t - at;
        if (t + 1 < end && (!mask || mask[t + 1] == 1)) tg[i * T + t] = tok[t + 1];
      }
      if (at < T) out.cu_seqlens.push_back(i * T + std::min(end, T));
      at = end;
    }
    // Padding: a segment of its own (attends to itself only; no target).
    for (std::int64_t t = at; t < T; ++t) pos[i * T + t] = t - at;
    if (at < T) out.cu_seqlens.push_back(i * T + T);
  }
  return out;
}
}  // namespace

TokenTensors to_tensors(const TokenBatch& b) {
  if (b.rows_apart()) return rows_to_tensors(b);
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
  TokenTensors out;
  out.inputs = all.index({Slice(), Slice(0, b.seq_len)}).contiguous();
  out.targets = targets;
  return out;
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
