// Memory planner: per-rank bytes and communication volume of one training step for every
// sharding strategy, computed from the engine's layout (fsdp::plan_units on the model the builder
// makes), the engine's limits (fsdp/engine.h), and the activations each model reports
// (model::Model::activation_bytes) (docs/memory-planner.md).
#pragma once
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/deck/deck.h"
#include "shardtrain/fsdp/options.h"
#include "shardtrain/fsdp/wrap.h"
#include "shardtrain/model/model.h"
#include "shardtrain/train/step_time.h"

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
  // Measured cost of a ring edge's byte when e = 2, 3, ... ring edges leave one host at once
  // ([e - 2]; `plan --inter-host-weight W,W2,...`): concurrent flows need not share a link
  // fairly or fully. Past the list: inter_host_weight x e (the link's bandwidth split evenly).
  std::vector<double> shared_link_weights;
  int threads = 1;                  // intra-op threads per rank (bf16/fp16 GEMM workspace is per thread)
  StepTimeSettings step;            // compute rate, bandwidth, latency, cores: the step-time estimate's inputs
};

// Reads model.*, fsdp.*, optimizer.*, train.* and parallel.shard_group_size from a deck.
// ranks / ranks_per_host are the caller's (CLI flags).
PlanSettings plan_settings_from_deck(const deck::Deck& d, int ranks, int ranks_per_host);

// What one micro-batch saves and works in, as the model reports it (model::Model::activation_bytes
// for the spec's architecture, on a meta model; mp: compute dtype and fp32-kept norms).
using ActivationBytes = model::ActivationBytes;
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
  std::vector<fsdp::UnitPlan> units;  // the engine's layout (fsdp::plan_units) for shard_size
  MemoryBreakdown mem;                // with the deck's activation_checkpointing
  MemoryBreakdown mem_no_recompute;   // activation_checkpointing = false
  MemoryBreakdown mem_recompute;      // activation_checkpointing = true
  CommVolume comm;
  // Sum over the collectives' ring families of bytes per rank x max(1, link_weight(the family's
  // ring edges on the busiest host's link)): intra-host bytes of equal time.
  double comm_cost = 0;
  // Inter-host bytes per rank per step without the ZeRO++ options, with fsdp.quantize_weights
  // alone, quantize_grads alone, secondary_shards alone, and every one this strategy runs (-1:
  // the strategy does not run that option). `comm` is the deck's choice.
  int64_t inter_host_plain = 0, inter_host_qwz = -1, inter_host_qgz = -1, inter_host_hpz = -1, inter_host_all = -1;
  // The deck's collectives one by one (what `comm` sums), and the step time they give.
  std::vector<PlannedCollective> collectives;
  StepEstimate step;               // with the deck's activation_checkpointing
  StepEstimate step_no_recompute;  // activation_checkpointing = false
  StepEstimate step_recompute;     // activation_checkpointing = true (one more forward per block)
};

// FLOPs of one step per rank: the model's own count for MFU (model::Model::train_flops_per_item)
// x the items one rank trains on per step, plus the blocks' forward again under recomputation.
double step_flops(const PlanSettings& s, bool recompute);

// What one byte costs, in intra-host bytes, on a ring edge of a family whose rings put `edges`
// edges on the busiest host's link at once: 0 edges 1 (no link), 1 edge inter_host_weight,
// e >= 2 the measured shared_link_weights[e - 2], else inter_host_weight x e.
double link_weight(const PlanSettings& s, int edges);

StrategyPlan plan_strategy(const PlanSettings& s, fsdp::Strategy strategy);
// All five strategies (hybrid ones only when the world has more than one shard group).
std::vector<StrategyPlan> plan_all(const PlanSettings& s);
const std::vector<fsdp::Strategy>& all_strategies();

// Index in `plans` of the plan whose peak fits `device_bytes` with the shortest estimated step
// (StrategyPlan::step_no_recompute; if none fits without recomputation, step_recompute among
// those that fit with it; ties to the smaller peak); -1 if none fits. *recompute tells whether
// that plan needs activation checkpointing.
int recommend(const std::vector<StrategyPlan>& plans, int64_t device_bytes, bool* recompute);

// One line: what the step estimate assumed (rate and its source, bandwidth, latency, cores).
std::string describe_step_assumptions(const PlanSettings& s);
// The report `shardtrain plan` prints.
std::string format_plan(const PlanSettings& s, const std::vector<StrategyPlan>& plans, int64_t device_bytes);
// ASCII diagram: which rank holds which slice of which unit (blocks with one layout folded).
std::string sharding_diagram(const PlanSettings& s, const StrategyPlan& p, int width = 48);

// "80GiB", "1.5e9", "512MiB", "2GB", plain bytes -> bytes (UserError naming `what` otherwise).
int64_t parse_bytes(const std::string& text, const std::string& what);
std::string format_bytes(int64_t bytes);  // "1.23 GiB"

}  // namespace shardtrain::train
