// Memory planner: per-rank bytes and communication volume of one training step for every
// sharding strategy, computed from the model the builder makes, the engine's wrap policy and
// flat layout, and the activations autograd saves in src/model (docs/memory-planner.md).
#pragma once
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/deck/deck.h"
#include "shardtrain/fsdp/options.h"
#include "shardtrain/model/model.h"

namespace shardtrain::train {

// Everything the plan depends on besides the strategy.
struct PlanSettings {
  model::ModelSpec spec;            // resolved (model::resolve_spec)
  fsdp::EngineOptions engine;       // wrap policy, mixed precision, prefetch, recomputation
  std::string optimizer = "adamw";  // adamw: 2 fp32 states; sgd: 1 with momentum, else 0
  double sgd_momentum = 0.9;
  int64_t micro_batch = 1;          // samples per rank per forward
  int64_t grad_accum = 1;           // micro-batches per optimizer step
  int ranks = 1;                    // world size
  int ranks_per_host = 1;           // hosts = ranks / ranks_per_host
  int shard_group_size = 0;         // hybrid strategies: 0 = ranks_per_host
  double inter_host_weight = 8;     // comm cost of one inter-host byte in intra-host bytes
  int threads = 1;                  // intra-op threads per rank (bf16/fp16 GEMM workspace is per thread)
};

// Reads model.*, fsdp.*, optimizer.*, train.* and parallel.shard_group_size from a deck.
// ranks / ranks_per_host are the caller's (CLI flags).
PlanSettings plan_settings_from_deck(const deck::Deck& d, int ranks, int ranks_per_host);

// One flat parameter as the engine lays it out (docs/fsdp.md, "Flat parameters").
struct FlatLayout {
  at::ScalarType dtype = at::kFloat;   // compute dtype of the unsharded buffer
  int64_t numel = 0;                   // parameters' elements
  int64_t padded = 0, shard_numel = 0; // for the plan's shard-group size
  std::vector<std::pair<std::string, int64_t>> params;  // (qualified name, numel), flat order
  int64_t elem_bytes() const { return static_cast<int64_t>(c10::elementSize(dtype)); }
};

struct UnitLayout {
  std::string name;                    // "<root>", "transformer.h.0", ..., "<ignored>"
  bool is_root = false, is_ignored = false;
  std::vector<FlatLayout> flats;       // compute dtype first, then keep_fp32 (mixed precision)
  int64_t numel() const;
};

// Units and flats (unpadded) exactly as fsdp::Engine would wrap spec's model under opts:
// the model is built on the meta device and the engine's wrap policy is applied to it.
std::vector<UnitLayout> layout_units(const model::ModelSpec& spec, const fsdp::EngineOptions& opts);
// Pads every flat to the shard-group size S (padded = max(S, ceil(numel/S)*S)).
void pad_units(std::vector<UnitLayout>& units, int S);

// What autograd keeps and what a step allocates on top, for one micro-batch on one rank
// (bytes; "relative" terms are changes from the state at the start of a block's backward).
struct ActivationBytes {
  int64_t inputs = 0;          // the batch tensors
  int64_t embed_saved = 0;     // saved by the root before the first block
  int64_t embed_saved_rc = 0;  // the same under recomputation (besides the first block's input)
  int64_t block_saved = 0;     // saved per block, its output included when the next block keeps it
  int64_t block_out_saved = 0; // the part of block_saved that is the block's output
  int64_t block_io = 0;        // one block's input (all recomputation keeps per block)
  int64_t last_out_kept = 0;   // the last block's output, when the final norm keeps it (recomputation)
  int64_t norm_saved = 0;      // one norm's saved tensors
  int64_t grad_in = 0;         // the gradient entering a block
  int64_t block_bwd_mlp = 0;   // relative: the peak of the block's MLP backward
  int64_t block_bwd_attn = 0;  // relative: the peak of its attention backward (may be < 0)
  int64_t head_saved = 0;      // saved by the final norm
  int64_t head_fwd_work = 0;   // logits and log-softmax at the peak of the loss
  int64_t head_bwd_work = 0;   // loss backward at its peak (before the root's gradient buffer)
  int64_t head_bwd_mm = 0;     // head projection backward: logits grad, input and weight grads
  int64_t held_grad = 0;       // held through the whole backward (a tied embedding's head gradient)
  int64_t embed_bwd = 0;       // embedding gradients at the end of backward
  int64_t gemm_ws = 0;         // bf16/fp16 weight-gradient GEMM workspace (libtorch's blocked kernel), all threads
  int64_t blocks = 0;          // number of blocks
  // Saved activations of the whole forward, the batch included.
  int64_t saved(bool recompute) const;
};
ActivationBytes activation_bytes(const model::ModelSpec& spec, const fsdp::MixedPrecision& mp, int64_t micro_batch,
                                 int threads = 1);

// Per rank, bytes.
struct MemoryBreakdown {
  int64_t params = 0;          // fp32 master shards
  int64_t grads = 0;           // fp32 gradient shards
  int64_t optim = 0;           // optimizer states (fp32)
  int64_t unsharded = 0;       // unsharded parameter buffers at the peak (compute dtype)
  int64_t grad_buffers = 0;    // unsharded gradient buffers (incl. pending reductions) at the peak
  int64_t activations = 0;     // saved activations + working memory at the peak
  int64_t total = 0;           // the peak: the largest of the instants below
  std::string peak_at;         // which instant ("init", "loss", "head backward", "last block backward", "clip")
  bool state_on_host = false;  // fsdp.cpu_offload: params, grads and optim are host memory, not in total
  int64_t saved_activations = 0;  // saved by the whole forward (without working memory)
  int64_t state() const { return params + grads + optim; }
};

// Per rank per step (grad_accum micro-batches), bytes each rank sends; a collective whose
// group spans hosts is counted inter-host (its ring runs at the inter-host link's speed).
struct CommVolume {
  int64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0;
  int64_t intra_host = 0, inter_host = 0;
  // Bytes the busiest host sends over its link per step (ring edges that leave the host x bytes
  // per rank; hybrid_shard's replicate rings all cross it): what a host's network counters show.
  int64_t inter_host_link = 0;
  int64_t total() const { return all_gather + reduce_scatter + all_reduce; }
};

struct StrategyPlan {
  fsdp::Strategy strategy = fsdp::Strategy::FullShard;
  int shard_size = 1, replicate_size = 1;
  bool shard_spans_hosts = false, replicate_spans_hosts = false;
  std::vector<UnitLayout> units;      // padded for shard_size
  MemoryBreakdown mem;                // with the deck's activation_checkpointing
  MemoryBreakdown mem_no_recompute;   // activation_checkpointing = false
  MemoryBreakdown mem_recompute;      // activation_checkpointing = true
  CommVolume comm;
  // Sum over the collectives' ring families of bytes per rank x max(1, inter_host_weight x the
  // family's ring edges on the busiest host's link): intra-host bytes of equal time.
  double comm_cost = 0;
};

StrategyPlan plan_strategy(const PlanSettings& s, fsdp::Strategy strategy);
// All five strategies (hybrid ones only when the world has more than one shard group).
std::vector<StrategyPlan> plan_all(const PlanSettings& s);
const std::vector<fsdp::Strategy>& all_strategies();

// Index in `plans` of the cheapest plan whose peak fits `device_bytes` (preferring no
// recomputation, then the least weighted communication); -1 if none fits. *recompute tells
// whether that plan needs activation checkpointing.
int recommend(const std::vector<StrategyPlan>& plans, int64_t device_bytes, bool* recompute);

// The report `shardtrain plan` prints.
std::string format_plan(const PlanSettings& s, const std::vector<StrategyPlan>& plans, int64_t device_bytes);
// ASCII diagram: which rank holds which slice of which unit (blocks with one layout folded).
std::string sharding_diagram(const PlanSettings& s, const StrategyPlan& p, int width = 48);

// "80GiB", "1.5e9", "512MiB", "2GB", plain bytes -> bytes (UserError naming `what` otherwise).
int64_t parse_bytes(const std::string& text, const std::string& what);
std::string format_bytes(int64_t bytes);  // "1.23 GiB"

}  // namespace shardtrain::train
