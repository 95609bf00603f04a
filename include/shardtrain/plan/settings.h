// What the planner plans for: the model, the engine options, the batch, the world and its hosts,
// the link weights and the step-time assumptions. Built by the caller (train::plan_settings_from_deck
// reads a deck; the CLI adds its flags); the plan layer reads no deck.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/fsdp/options.h"
#include "shardtrain/model/model.h"
#include "shardtrain/plan/step_time.h"

namespace shardtrain::plan {

// The device a plan is for (`plan --target`), as far as the model's costs depend on it
// (model::CostQuery): a CPU (the explicit attention, libtorch's bf16 GEMM workspace), or CUDA
// (no CPU GEMM workspace; the fused attention kernels where the build has them:
// model::attention_is_fused).
struct Target {
  bool cuda = false;
  bool fused_attention = false;
};

// The token windows planned for (data.packing and the dataset's rows): rows apart bound the
// attention's scores by the longest row, and their tokens' work is what the step computes.
struct Windows {
  std::string packing = "stream";  // what the plan says it assumed
  int64_t attention_span = 0;      // the longest row (0: T, one sequence per window)
  double fill = 1;                 // the share of window positions that hold rows' tokens
  double attention_length = 0;     // sum L^2 / sum L over the rows (0: T)
};

// Everything the plan depends on besides the strategy.
struct PlanSettings {
  model::ModelSpec spec;            // resolved (model::resolve_spec)
  // Wrap policy, mixed precision, prefetch, recomputation, compression, and the hybrid strategies'
  // replica sync (engine.replica_sync: parallel.replica_sync and the [diloco] section; default
  // every step): the engine's own options, one source for the engine and the plan.
  fsdp::EngineOptions engine;
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
  Target target;                    // the device planned for (plan --target; default a CPU)
  Windows windows;                  // how the deck's data fills its windows (default the stream)
  StepTimeSettings step;            // compute rate, bandwidth, latency, cores: the step-time estimate's inputs
};

// Whether strategy st, with shard groups of shard_size ranks, runs DiLoCo under ps: the deck asks
// for it, the strategy is a hybrid one (its replicas are the shard groups) and there is more
// than one replica. Every other strategy, and a hybrid on one replica, syncs every step.
inline bool runs_diloco(const PlanSettings& ps, fsdp::Strategy st, int shard_size) {
  return ps.engine.replica_sync.diloco() && fsdp::is_hybrid(st) && shard_size > 0 && ps.ranks / shard_size > 1;
}

}  // namespace shardtrain::plan
