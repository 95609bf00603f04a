// Rows: rows packed apart in a batch of token windows (data.packing, docs/data.md "Rows whole
// and apart"): what a language model needs to compute each row as if it were alone.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace shardtrain::model {

struct Rows {
  // int64 [B, T]: each token's position in its row (RoPE, GPT-2's learned positions).
  at::Tensor positions;
  // The rows' boundaries over the B x T tokens taken in order (flash attention's cu_seqlens):
  // 0, the end of each row, ..., B x T; no row crosses a window's end. Causal attention runs
  // inside each row only.
  std::vector<int64_t> cu_seqlens;
  // Empty: one sequence per window, positions 0..T-1 (the stream, generation).
  bool empty() const { return cu_seqlens.empty(); }
  // The longest row (what the explicit attention's score matrix is sized by).
  int64_t longest() const;
};

}  // namespace shardtrain::model
