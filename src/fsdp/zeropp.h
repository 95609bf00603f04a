// ZeroPP: the engine's ZeRO++-style compression of what crosses nodes (EngineOptions::
// compression): the quantized weight all-gather (qwZ), the quantized gradient average across
// replicas with error feedback (qgZ), and the accuracy guard that checks both against the exact
// result every K steps and falls a flat back to full precision above a threshold. The engine
// calls it from three hooks: the gather of a flat (schedule.cpp issue_gather), the replica
// average at the end of the last micro-batch's backward (end_backward), and the checkpoint's
// residual access (engine.cpp).
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/flat_param.h"
#include "unit.h"

namespace shardtrain::fsdp {

class ZeroPP {
 public:
  // node: the ranks of this rank's node (secondary shards), or nullptr.
  ZeroPP(const Compression& c, const c10::Device& device, comm::Comm* node);
  const Compression& options() const { return c_; }

  // The all-gather of fp's shards into its unsharded buffer (the engine's all_gather_flat
  // when qwZ is off or the flat fell back): int8 codes and scales on the wire, dequantized
  // into `full` when the returned work is waited for. On a guard step the exact gather runs
  // too and is compared there.
  // backward: the gather before a unit's backward, which a secondary shard serves from inside
  // the node (hpZ); any other gather drops a secondary shard left over.
  comm::WorkPtr gather(Unit& u, FlatParam& fp, const at::Tensor& mine, bool backward, MemoryStats& ms);
  // hpZ, post-forward (before the unit is resharded): keeps this rank's slice of each of u's
  // unsharded flats over the node group.
  void keep_secondary(Unit& u, MemoryStats& ms);

  // qgZ, first half: takes the flats it averages out of `shards` (setting their comm to
  // nullptr) and issues their quantized all-gathers across replicas.
  void issue_replica_average(std::vector<std::pair<comm::Comm*, FlatParam*>>& shards);
  // Second half, after the others were averaged: waits, dequantizes and sums in fp32 into the
  // gradient shards, runs the guard; ends the optimizer step (the guard's step count).
  void finish_replica_average(Engine::Impl& m);
  // The end of an optimizer step without a replica average (no qgZ flat).
  void end_step() { ++step_; }

  CommStats& stats() { return stats_; }

  // Checkpoint access (Engine::residual_names, gather_residuals, set_residuals): the
  // residual of one flat, zeros until the first quantized average.
  at::Tensor& residual(FlatParam& fp);
  // The masters were written outside an optimizer step (a checkpoint load): quantize again.
  void masters_changed() {
    for (auto& [fp, f] : flat_) f.packed_step = -1;
  }

 private:
  struct PerFlat {
    bool weights_fallback = false, grads_fallback = false;
    at::Tensor residual;  // fp32 [shard_numel]: what quantization left out of the last average
    // qwZ: this rank's master shard quantized once per optimizer step (the masters change only
    // in the step), reused by every gather until the next: backward's, other micro-batches'.
    at::Tensor packed;
    int64_t packed_step = -1;
  };
  struct PendingAverage {
    FlatParam* fp = nullptr;
    comm::Comm* replicate = nullptr;
    comm::WorkPtr work, exact_work;
    at::Tensor wire, exact;  // exact: the fp32 average of (gradient + residual), guard steps
  };
  bool guard_step() const { return c_.guard_every > 0 && step_ % c_.guard_every == 0; }
  // Before a guard result is recorded: a new guard step starts its maxima afresh.
  void begin_record();
  int64_t recorded_step_ = -1;
  void warn_fallback(const char* what, const FlatParam& fp, double rel);

  Compression c_;
  c10::Device device_;
  int64_t step_ = 0;
  std::map<const FlatParam*, PerFlat> flat_;
  comm::Comm* node_ = nullptr;
  std::map<const FlatParam*, at::Tensor> secondary_;  // compute dtype [padded / node size]
  void drop_secondary(const FlatParam& fp, MemoryStats& ms);
  std::vector<PendingAverage> pending_;
  CommStats stats_;
  friend class QuantizedGatherWork;
};

}  // namespace shardtrain::fsdp
