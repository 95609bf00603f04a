// ZeroPP: the engine's ZeRO++-style compression of what crosses nodes (EngineOptions::
// compression): the state of the quantized weight all-gather (qwZ), the quantized gradient
// average across replicas with error feedback (qgZ), the secondary shards (hpZ), and the accuracy
// guard that checks both quantized collectives against the exact result every K steps and falls
// a flat back to full precision above a threshold. What goes over the wire is collectives.h's;
// this class decides which of them a flat gets and keeps what they leave (residuals, fallbacks,
// the packed masters, secondary shards). The engine's schedule calls it at the gather of a flat
// (issue_gather), after a unit's forward (keep_secondary), at the replica average of the last
// micro-batch (end_backward) and for the checkpoint's residuals (engine.cpp), always with
// explicit inputs: it knows nothing of the engine's internals.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <functional>
#include <memory>

#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/flat_param.h"
#include "collectives.h"

namespace shardtrain::fsdp {

class ZeroPP {
 public:
  // node: the ranks of this rank's node (secondary shards), or nullptr.
  ZeroPP(const Compression& c, const c10::Device& device, comm::Comm* node);
  const Compression& options() const { return c_; }

  // The all-gather of fp's shards into its unsharded buffer over `shard`: the plain one
  // (all_gather_flat) when qwZ is off, the flat is not quantized (quantizable = false: the
  // ignored group) or fell back; else the quantized one, with the exact gather beside it on a
  // guard step. backward: the gather before a unit's backward, which a secondary shard serves
  // from inside the node (hpZ); any other gather drops a secondary shard left over.
  comm::WorkPtr gather(comm::Comm& shard, FlatParam& fp, const at::Tensor& mine, bool quantizable, bool backward,
                       MemoryStats& ms);
  // hpZ, post-forward of a unit (not the ignored group), before it is resharded: keeps this
  // rank's slice of each of its unsharded flats over the node group.
  void keep_secondary(const std::vector<std::unique_ptr<FlatParam>>& flats, MemoryStats& ms);

  // qgZ, first half: takes the flats it averages out of `shards` (setting their comm to
  // nullptr) and issues their quantized averages across replicas.
  void issue_replica_average(std::vector<std::pair<comm::Comm*, FlatParam*>>& shards);
  // Second half, after the others were averaged: waits (through `wait`, the engine's timed wait),
  // writes the averages into the gradient shards, runs the guard (its error terms summed over
  // `shard`, nullptr when not sharded); ends the optimizer step (the guard's step count).
  void finish_replica_average(comm::Comm* shard, const std::function<void(comm::Work&)>& wait);
  // The end of an optimizer step without a replica average (no qgZ flat).
  void end_step() { ++step_; }

  CommStats& stats() { return stats_; }

  // Checkpoint access (Engine::residual_names, gather_residuals, set_residuals): the
  // residual of one flat, zeros until the first quantized average.
  at::Tensor& residual(FlatParam& fp);
  // The guard's decisions, for a checkpoint (Engine::guard_state): per flat of `flats`, whether
  // its weight gather / replica average fell back to full precision; and the optimizer steps
  // counted so far, which decide the guard steps (every guard_every-th).
  void fallbacks(const std::vector<FlatParam*>& flats, std::vector<uint8_t>& weights,
                 std::vector<uint8_t>& grads) const;
  int64_t steps() const { return step_; }
  // After a load: the same, given back (sizes checked by the caller).
  void restore(const std::vector<FlatParam*>& flats, const std::vector<uint8_t>& weights,
               const std::vector<uint8_t>& grads, int64_t steps);
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
    Int8Average avg;  // avg.exact: the fp32 average of (gradient + residual), guard steps
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
};

}  // namespace shardtrain::fsdp
