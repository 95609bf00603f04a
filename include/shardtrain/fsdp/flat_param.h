// FlatParam: one unit's parameters of one dtype, flattened, padded and sharded.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/comm/comm.h"

namespace shardtrain::fsdp {

// Where one parameter lives inside its FlatParam.
struct ParamSlot {
  std::string name;                 // qualified name, as in root.named_parameters()
  std::vector<int64_t> shape;
  int64_t offset = 0;               // element offset in the unsharded flat buffer
  int64_t numel = 0;
  at::Tensor param;                 // the module's parameter: a leaf over `full`'s storage
  std::vector<std::pair<torch::nn::Module*, std::string>> owners;  // (module, local name)
};

// The flat layout: all parameters concatenated in a fixed order, padded to a multiple of
// the shard-group size S. Rank r of the shard group owns elements [r*L, (r+1)*L),
// L = padded/S, in fp32 (master weights, gradient shard, optimizer state). The
// unsharded buffer `full` is in the compute dtype; its storage is allocated and
// all-gathered on unshard and released to 0 bytes on reshard. When S == 1 and the
// compute dtype is fp32, `full` and `master` share one storage and nothing is freed (not under
// cpu_offload, where the master stays in host memory).
class FlatParam {
 public:
  enum class State { Sharded, Gathering, Unsharded };

  at::ScalarType dtype = at::kFloat;  // compute dtype of `full`
  std::vector<ParamSlot> slots;
  int64_t numel = 0, padded = 0, shard_numel = 0;
  int shard_rank = 0, shard_size = 1;

  at::Tensor master;      // fp32 [L]            (host, pinned on CUDA, when offloaded)
  at::Tensor grad_shard;  // fp32 [L], accumulates over micro-batches (host when offloaded)
  at::Tensor full;        // dtype [padded] on the engine's device; storage 0 bytes while sharded
  bool offloaded = false; // master and grad_shard kept apart from `full` (cpu_offload)

  State state = State::Sharded;
  bool stale = true;      // master changed since `full` was filled
  comm::WorkPtr gather_work;

  bool aliases_master() const;  // fsdp::aliases_master (wrap.h) of this flat
  int64_t full_bytes() const { return padded * static_cast<int64_t>(c10::elementSize(dtype)); }
  // Bytes the unsharded storage holds right now (0 while sharded).
  int64_t live_full_bytes() const;
};

// Resizes a tensor's storage in place (0 frees it). Tensors that share the storage,
// including ones autograd saved, see the new memory: that is what makes resharding
// after forward and re-gathering before backward safe.
void resize_storage(const at::Tensor& t, int64_t nbytes);
// A tensor over `base`'s storage with its own version counter and no autograd history:
// writes through it (all-gathers, casts) do not invalidate what autograd saved.
at::Tensor storage_alias(const at::Tensor& base, int64_t offset, at::IntArrayRef shape);

}  // namespace shardtrain::fsdp
