// The planner's memory model: per-rank bytes of one step at each of its instants (init, loss,
// backward through the head and the last blocks, clip), from the engine's layout (fsdp::plan_units),
// the engine's limits (fsdp/engine.h) and the activations each model reports
// (model::Model::activation_bytes); docs/memory-planner.md.
#pragma once
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/fsdp/options.h"
#include "shardtrain/fsdp/wrap.h"
#include "shardtrain/model/model.h"
#include "shardtrain/plan/settings.h"

namespace shardtrain::plan {

// What one micro-batch saves and works in, as the model reports it (model::Model::activation_bytes
// for the spec's architecture, on a meta model; mp: compute dtype and fp32-kept norms).
using ActivationBytes = model::ActivationBytes;
using BlockBytes = model::BlockBytes;
ActivationBytes activation_bytes(const model::ModelSpec& spec, const fsdp::MixedPrecision& mp, int64_t micro_batch,
                                 int threads = 1, const Target& target = {});

// The model's cost query for one micro-batch under mixed precision mp on `target`.
model::CostQuery cost_query(const fsdp::MixedPrecision& mp, int64_t micro_batch, int threads, const Target& target = {},
                            int64_t attention_span = 0);

// Per rank, bytes.
struct MemoryBreakdown {
  int64_t params = 0;          // fp32 master shards of the trainable flats
  int64_t frozen = 0;          // frozen shards in their dtype (fsdp::FlatPlan::frozen: no master, grad, state)
  int64_t frozen_nf4 = 0;      // of `frozen`: NF4 shards (fsdp::FlatPlan::nf4: codes + statistics, shard_bytes())
  int64_t grads = 0;           // fp32 gradient shards (trainable flats)
  int64_t optim = 0;           // optimizer states (fp32, trainable flats)
  int64_t outer = 0;           // DiLoCo: the fp32 outer copy and outer momentum of the trainable shards (runs_diloco)
  int64_t unsharded = 0;       // unsharded parameter buffers at the peak (compute dtype; frozen flats too)
  // NF4 gathers in flight at the peak: each holds a wire buffer of S x shard_bytes() (every rank's
  // packed shard) until it is waited for and dequantized into its unsharded buffer (the block
  // prefetched during a block's backward); 0 without NF4 flats or with S = 1.
  int64_t nf4_wire = 0;
  int64_t grad_buffers = 0;    // unsharded gradient buffers (incl. pending reductions) at the peak
  int64_t activations = 0;     // saved activations + working memory at the peak
  int64_t total = 0;           // the peak: the largest of the instants below
  std::string peak_at;         // which instant ("init", "loss", "head backward", "last block backward", "clip")
  bool state_on_host = false;  // fsdp.cpu_offload: the state() is host memory, not in total
  // fsdp.cpu_offload: host memory per rank: the state() plus the staging of the gradient copies
  // to the host (fsdp::kMaxPendingCopies of the largest trainable shard, fp32); 0 without offload.
  int64_t host = 0;
  int64_t saved_activations = 0;  // saved by the whole forward (without working memory)
  int64_t state() const { return params + frozen + grads + optim + outer; }
};

// NF4 (QLoRA's base): the temporaries of dequantizing one slice of L values of an NF4 flat on
// the planned target (fsdp::nf4::dequant_temp_bytes, the engine's own statement of them). A gather
// dequantizes one rank's slice at a time.
int64_t nf4_dequant_bytes(int64_t L, const fsdp::nf4::Format& f, bool cuda);

// The peak of one step of strategy st over `units` (shard group size S), with activations `a`,
// with (rc) or without recomputation.
MemoryBreakdown peak_memory(const PlanSettings& ps, fsdp::Strategy st, const std::vector<fsdp::UnitPlan>& units, int S,
                            const ActivationBytes& a, bool rc);

}  // namespace shardtrain::plan
