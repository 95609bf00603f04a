// The plan of one sharding strategy: the engine's layout, the memory peak (memory.h), the
// traffic (traffic.h) and the step time (step_time.h) with and without recomputation; every
// strategy at once, and the recommendation (docs/memory-planner.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/fsdp/options.h"
#include "shardtrain/fsdp/wrap.h"
#include "shardtrain/plan/memory.h"
#include "shardtrain/plan/settings.h"
#include "shardtrain/plan/step_time.h"
#include "shardtrain/plan/traffic.h"

namespace shardtrain::plan {

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
  // DiLoCo (runs_diloco; otherwise diloco = false and the rest empty): the outer sync of one
  // cycle (its bytes per step are in `comm`, its time in the step estimates), and the same
  // strategy's host-link bytes per step when its replicas sync every step.
  bool diloco = false;
  OuterSync outer;
  int64_t every_step_link = 0;
};

// FLOPs of one step per rank: the model's own count for MFU (model::Model::train_flops_per_item)
// x the items one rank trains on per step, plus the blocks' forward again under recomputation.
double step_flops(const PlanSettings& s, bool recompute);

StrategyPlan plan_strategy(const PlanSettings& s, fsdp::Strategy strategy);
// All five strategies (hybrid ones only when the world has more than one shard group).
std::vector<StrategyPlan> plan_all(const PlanSettings& s);
const std::vector<fsdp::Strategy>& all_strategies();

// Index in `plans` of the plan whose peak fits `device_bytes` with the shortest estimated step
// (StrategyPlan::step_no_recompute; if none fits without recomputation, step_recompute among
// those that fit with it; ties to the smaller peak); -1 if none fits. *recompute tells whether
// that plan needs activation checkpointing.
int recommend(const std::vector<StrategyPlan>& plans, int64_t device_bytes, bool* recompute);

// QLoRA's base (lora.base_dtype = "nf4"): q's LoRA base with the blocks' frozen linear weights
// as NF4 codes in blocks of `block` values, their statistics double-quantized with double_quant:
// the spec records it (model::LoraSpec::nf4_block) and the engine's options name the weights
// (fsdp::Nf4Base from model::nf4_base_params of q's model, as train::engine_options_from_deck
// does for a deck), so that plan_units lays out the NF4 flats. q must have LoRA (rank > 0).
inline constexpr int64_t kQloraBlock = 64;  // QLoRA's (bitsandbytes' default blocksize)
PlanSettings with_nf4_base(PlanSettings q, int64_t block = kQloraBlock, bool double_quant = true);

// When nothing fits: the deck changed one way at a time, each planned (every strategy) and its
// recommendation taken: fsdp.cpu_offload (with its host memory), LoRA of rank kLoraRank on
// every linear layer of the blocks (without a LoRA in the deck), QLoRA (a LoRA deck's base in NF4
// with double quantization; without a LoRA in the deck, LoRA of rank kLoraRank and its base in
// NF4), more ranks (whole hosts, up to 64x), a micro-batch of 1 (the global batch kept by
// grad_accum), bf16 (from fp32); LoRA with cpu_offload when neither fits alone, and QLoRA with
// cpu_offload when neither of those fits alone.
inline constexpr int64_t kLoraRank = 16;
struct Alternative {
  std::string change;          // as the deck key or flag would say it
  std::string set;             // the same as `--set KEY=VALUE` flags of plan and train
  bool qlora = false;          // the change stores the base in NF4 (lora.base_dtype = "nf4")
  bool fits = false;
  StrategyPlan plan;           // its recommendation; if nothing fits, the smallest peak
  bool recompute = false;      // that plan needs fsdp.activation_checkpointing
  int ranks = 0, ranks_per_host = 0;
  const MemoryBreakdown& mem() const { return recompute ? plan.mem_recompute : plan.mem_no_recompute; }
};
std::vector<Alternative> alternatives(const PlanSettings& s, int64_t device_bytes);
// The alternative to name when, on the deck's `ranks` and without host memory, only QLoRA fits:
// the first QLoRA alternative that fits when no other alternative does that keeps the ranks (the
// job has the ranks it has) and keeps the state on the device (cpu_offload's host memory is
// stated but not checked: few nodes have a TiB); nullptr otherwise.
const Alternative* only_qlora_fits(const std::vector<Alternative>& alts, int ranks);

}  // namespace shardtrain::plan
