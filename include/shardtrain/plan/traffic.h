// The planner's traffic model: the collectives one step issues (per unit, per micro-batch, the
// replica and world all-reduces), the bytes each rank sends, what crosses a host's link, and
// their cost in intra-host bytes; docs/memory-planner.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/fsdp/options.h"
#include "shardtrain/fsdp/quantize.h"
#include "shardtrain/plan/settings.h"
#include "shardtrain/plan/step_time.h"

namespace shardtrain::plan {

struct StrategyPlan;

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

// What one byte costs, in intra-host bytes, on a ring edge of a family whose rings put `edges`
// edges on the busiest host's link at once: 0 edges 1 (no link), 1 edge inter_host_weight,
// e >= 2 the measured shared_link_weights[e - 2], else inter_host_weight x e.
double link_weight(const PlanSettings& s, int edges);

// Ring edges that leave the busiest host when every group of a family runs its ring at once, in
// group-rank order (family "shard": the groups [kS, (k+1)S); "replicate": {j, j+S, j+2S, ...});
// N ranks, G per host.
int ring_edges_leaving_busiest_host(int N, int G, int S, bool shard_family);

// One step's communication for plan p (its units and groups set), with the quantized weight
// gather (qw), the quantized replica average (qg) and / or hpZ's secondary shards (hp).
struct Traffic {
  CommVolume volume;
  double cost = 0;                             // bytes x link weight, summed: intra-host bytes of equal time
  std::vector<PlannedCollective> collectives;  // what volume sums, one by one (step_time.h)
};
// Under DiLoCo (runs_diloco) the inner steps send nothing between replicas: no replica
// all-reduce among the collectives, qg has nothing to quantize, and the outer sync's bytes
// (outer_sync_traffic) are added to volume and cost amortised over the H steps of a cycle.
Traffic step_traffic(const PlanSettings& ps, fsdp::Strategy st, const StrategyPlan& p, bool qw, bool qg, bool hp);

// Bytes one rank sends averaging n fp32 values over `ranks` replicas in DiLoCo's outer wire
// format: fsdp::wire_average_bytes_sent (fp32 / bf16 a ring all-reduce, int8 / int4 an all-gather
// of `ranks` packed vectors); `guard`: the fraction of syncs that also run the exact fp32
// all-reduce (the accuracy guard of the quantized formats).
double outer_wire_bytes(int64_t n, fsdp::WireFormat f, int64_t block, int ranks, double guard);

// DiLoCo's outer sync of plan p (runs_diloco): the units cut into diloco.fragments consecutive
// fragments, each averaged across the replicate group once per cycle of H inner steps.
struct OuterSync {
  std::vector<PlannedCollective> fragments;  // one per fragment: bytes per rank of its one sync
  std::vector<int> first_unit;               // fragment f: units [first_unit[f], first_unit[f + 1])
  double bytes_per_cycle = 0;                // per rank, every fragment once
  double link_bytes_per_cycle = 0;           // over the busiest host's link
  double cost_per_cycle = 0;                 // bytes x link weight (intra-host bytes of equal time)
};
OuterSync outer_sync_traffic(const PlanSettings& ps, const StrategyPlan& p);

}  // namespace shardtrain::plan
