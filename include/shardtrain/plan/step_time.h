// Step-time model of the planner: one training step's compute (the model's FLOPs at a given rate)
// plus the communication the compute stream waits for, from the collectives the memory planner
// derives from the engine's layout (plan::step_traffic, traffic.h) and the engine's
// schedule rules (fsdp/schedule.cpp: when each collective is issued and waited for); see
// docs/memory-planner.md, "Step time".
#pragma once
#include <array>
#include <string>
#include <vector>

#include "shardtrain/fsdp/options.h"
#include "shardtrain/fsdp/wrap.h"

namespace shardtrain::plan {

// What the collectives of one ring kind cost the cores of a host its ranks outnumber, per op
// (index op_index(kind): all-gather, reduce-scatter, all-reduce): their message patterns keep the
// cores busy differently, and a ring over shared memory differently from one through a TCP stack.
struct CoreCosts {
  // The core time of one byte sent, in intra-host bytes (its time at intra_busbw_gbps): `bench
  // collectives --compute-ms`, core_us (what the collective adds to matmuls beside it) over the
  // bytes a rank sends at that bandwidth. A collective's time beyond this is the wire's, or waiting
  // on a peer: the cores are free to compute meanwhile.
  std::array<double, 3> weight{1, 1, 1};
  // Core time lost per collective when its ranks arrive from computing, out of phase, and the
  // early ones poll on cores the late ones need (the sync_us column). A shared-memory ring needs
  // both ends scheduled at once; a TCP ring's socket buffers let the early sender go on.
  std::array<double, 3> sync_us{0, 0, 0};
};

// What the estimate assumes; every field is a `shardtrain plan` flag (or measured by it).
struct StepTimeSettings {
  // Achieved TFLOP/s of one rank running the model's step on its own `threads` cores (0: no
  // compute term; the estimate is then the communication alone, nothing hidden behind it).
  double compute_tflops = 0;
  std::string compute_source = "none";
  // One core's optimizer step (and the clipping norm) per parameter it updates, ns; 0: the
  // optimizer is inside compute_tflops. Given, compute_tflops is the rate of forward and backward
  // alone, and each rank's optimizer updates its shard: 1/S of the parameters, all of them under
  // no_shard (`bench_optim`: adamw fused + sum_of_squares, ms / elements).
  double optimizer_ns_per_param = 0;
  // Bandwidth of one ring edge inside a host, GB/s (1e9 B/s; `bench collectives` busbw of an
  // all_reduce over the ranks of one host); an edge across a host's link runs at this / W_e
  // (PlanSettings::inter_host_weight, shared_link_weights: measured the same way).
  double intra_busbw_gbps = 20;
  double latency_us = 10;  // per ring step (one send and receive to the next rank)
  // Cores of one host; 0: at least ranks_per_host x threads (no oversubscription). Ranks whose
  // threads outnumber the cores share them: compute runs at cores / (ranks x threads) of its
  // rate, and the core time communication costs on a CPU host (shared-memory copies, the TCP
  // stack, polling progress threads) does not overlap compute: only the wire's time does.
  int cores_per_host = 0;
  // Shared cores only: what a collective costs the cores, per op (link: its ring crosses a host's
  // link; intra: it stays inside one host, over shared memory). Measured by `bench collectives
  // --compute-ms` over a ring of that kind (perf/cluster/run.sh): the world ring across the
  // hosts, and `--group-size` groups inside them.
  CoreCosts link_cores, intra_cores;
};

// One collective of the step as the engine issues it, per rank.
enum class CollectiveKind {
  ForwardGather,     // a unit's all-gather before its forward
  BackwardGather,    // a unit's all-gather again before its backward (reshard-after-forward)
  ReduceScatter,     // a unit's gradient reduce-scatter after its backward
  ReplicaAllReduce,  // the gradient shards' all-reduce over the replicate group after the last backward
};
const char* to_string(CollectiveKind k);
// The index of k's op in CoreCosts (0 all-gather, 1 reduce-scatter, 2 all-reduce).
int op_index(CollectiveKind k);

struct PlannedCollective {
  CollectiveKind kind = CollectiveKind::ForwardGather;
  int unit = 0;          // index in StrategyPlan::units (ReplicaAllReduce: -1, every unit at once)
  double bytes = 0;      // sent per rank by one occurrence
  int per_micro = 1;     // occurrences per micro-batch (ReplicaAllReduce: per step, 1)
  int ring_steps = 0;    // sends per rank: S-1 for a gather / reduce-scatter over S, 2(R-1) for an all-reduce
  double weight = 1;     // max(1, link_weight(ring edges on the busiest host's link)): time per byte in intra-host bytes
  bool crosses_link = false;  // its ring has edges on a host's link (else it stays inside hosts)
};

struct StepEstimate {
  double compute_s = 0;      // FLOPs / rate, plus the optimizer (at the host's core share)
  double optimizer_s = 0;    // of compute_s: the optimizer's step on this rank's shard
  double comm_s = 0;         // every collective's time, summed
  double comm_core_s = 0;    // shared cores: the part of comm_s spent on the cores (serialised with compute)
  double exposed_s = 0;      // the part of comm_s the compute stream waits for
  bool shared_cores = false;  // oversubscribed host: communication serialised with compute
  // DiLoCo (add_outer_sync): of comm_s and exposed_s, the outer sync's share per step (a cycle's
  // time / H); the inner step is the rest.
  double outer_comm_s = 0, outer_exposed_s = 0;
  double step_s() const { return compute_s + exposed_s; }
  double inner_step_s() const { return step_s() - outer_exposed_s; }
};

struct StepTimeInputs {
  fsdp::Strategy strategy = fsdp::Strategy::FullShard;
  const std::vector<fsdp::UnitPlan>* units = nullptr;
  const std::vector<PlannedCollective>* collectives = nullptr;
  double step_flops = 0;       // per rank per step, recomputation included
  double params_per_rank = 0;  // the parameters this rank's optimizer updates (its shards)
  int grad_accum = 1;
  int ranks_per_host = 1, threads = 1;
  bool forward_prefetch = false;
  fsdp::BackwardPrefetch backward_prefetch = fsdp::BackwardPrefetch::Pre;
  bool recompute = false;      // activation checkpointing: each block's forward runs again in its backward
};

// Each unit's share of a step's weight FLOPs, forward and backward, by its parameters as the model
// counts them (model::Model's weight_flops_per_token): forward 2 per parameter, backward 2 for the
// input's gradient and 2 more for a trainable parameter's own (6N without a fine-tune: forward
// 1/3, backward 2/3; a frozen parameter 2 and 2).
struct UnitFlops {
  double fwd = 0, bwd = 0;
};
std::vector<UnitFlops> unit_flops_shares(const std::vector<fsdp::UnitPlan>& units);
// Recomputation runs the blocks' forward again (the units that are neither root nor ignored), so
// a recomputing step has recompute_flops_factor(units) times the FLOPs of one without
// (step_flops, estimate_step): 1 + the blocks' forward share.
double recompute_flops_factor(const std::vector<fsdp::UnitPlan>& units);

// The core costs of c's ring kind (link_cores or intra_cores).
const CoreCosts& core_costs(const StepTimeSettings& s, const PlannedCollective& c);
// Seconds of one collective: latency x ring steps + bytes x weight / intra-host bandwidth, and on
// shared cores (shared = true) the sync cost of its ring kind and op.
double collective_seconds(const StepTimeSettings& s, const PlannedCollective& c, bool shared = false);
// Shared cores: the part of collective_seconds the cores spend (copies, reductions and the stack
// at min(weight, its core weight), the sync cost); the rest is the wire's or waiting on a peer.
double collective_core_seconds(const StepTimeSettings& s, const PlannedCollective& c);

// The estimate: compute split over the units by their parameters (forward 1/3, backward 2/3 of a
// unit's FLOPs, as 6N counts them), then the engine's order on two resources, the compute stream
// and one communication channel (the link and the copies are shared by every collective):
//   forward gather      waited before the unit's forward; issued one unit ahead when
//                       fsdp.forward_prefetch (hidden behind the previous unit's forward);
//   backward gather     issued one unit ahead when fsdp.backward_prefetch (hidden behind the
//                       previous unit's backward), the first one exposed;
//   reduce-scatter      runs behind the following units' backward; waited for when more than
//                       fsdp::kMaxPendingReductions are pending, and all at the end of backward;
//   replica all-reduce  after the last micro-batch's backward: exposed whole;
//   optimizer           after it, on the rank's shards (optimizer_ns_per_param).
// On an oversubscribed host (shared_cores) a collective's core part (collective_core_seconds)
// runs on the compute stream when it is issued; only its wire part overlaps compute.
StepEstimate estimate_step(const StepTimeSettings& s, const StepTimeInputs& in);

// DiLoCo: adds to e (an inner step's estimate) the outer sync of one cycle of H inner steps,
// per step: each fragment's average (`fragments`, one collective each) runs once per cycle on
// the link. With overlap_steps = 0 the replicas wait for it: exposed whole. With tau > 0 it runs
// behind the next tau inner steps: exposed only beyond their compute (tau x e->compute_s), and on
// shared cores at least its core part. comm_s and exposed_s grow by the cycle's sums / H.
void add_outer_sync(const StepTimeSettings& s, const std::vector<PlannedCollective>& fragments, int inner_steps,
                    int overlap_steps, StepEstimate* e);

}  // namespace shardtrain::plan
