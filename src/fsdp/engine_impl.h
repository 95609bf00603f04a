// Engine::Impl: the engine's state and its transitions. The hooks (forward hook, tensor hook on a
// unit's output, AccumulateGrad post hook, the end-of-backward callback) call the named
// transitions here (schedule.cpp); the collectives they issue are collectives.h's, the ZeRO++
// state (zeropp.h) is asked which of them a flat gets. The engine's options live here, once
// (Engine::options() reads them).
#pragma once
#include <c10/core/DeviceGuard.h>

#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "shardtrain/comm/compute_stream.h"
#include "shardtrain/fsdp/device.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/leaf_sum.h"
#include "counting_comm.h"
#include "unit.h"

namespace shardtrain::fsdp {

class ZeroPP;
class OuterSync;

struct Engine::Impl {
  ~Impl();
  EngineComms comms;  // the counting wrappers (below) of the job's communicators
  EngineOptions opts;
  std::vector<std::unique_ptr<Unit>> units;  // root first, ignored group last (if any)
  std::vector<UnitPlan> layout;              // what they were built from, one plan per unit
  Unit* ignored = nullptr;
  // The forward order of the units, recorded in the first forward; prefetching follows it.
  struct ExecOrder {
    std::vector<Unit*> units;
    bool recorded = false;
  } order;
  // Idle until the first unit's pre-backward of a backward pass, Backward until its end.
  enum class Phase { Idle, Backward } phase = Phase::Idle;
  bool last_micro = true;                    // set_last_micro_batch: average replicas at the end
  std::deque<FlatParam*> inflight;           // issued all-gathers not yet waited
  std::vector<PendingReduce> pending;        // reduce-scatters not yet retired, in issue order
  std::deque<PendingD2H> d2h;                // device->host gradient copies (cpu_offload)
  // opts.reproducible: each flat's reduced leaf gradients of this step, summed in tree order.
  std::unordered_map<const FlatParam*, LeafSum> leaf_sums;
  std::unique_ptr<DeviceRuntime> dev;
  MemoryStats stats;
  // Bytes sent inside / between nodes: every communicator the engine uses is a CountingComm.
  ByteCounters bytes;
  std::vector<std::unique_ptr<CountingComm>> counted;
  // Quantized collectives and their guard (zeropp.h); null when EngineOptions::compression is off.
  std::unique_ptr<ZeroPP> zpp;
  std::vector<std::vector<at::Tensor>> residual_host;  // Engine::residual_staging
  // DiLoCo's outer copy, momentum and outer step (outer_sync.h); null under every_step.
  std::unique_ptr<OuterSync> outer;
  std::vector<int> last_synced;  // the fragments the last sync_replicas synced
  std::vector<std::vector<at::Tensor>> diloco_host;  // Engine::diloco_staging

  // Every entry from a hook or the API: NCCL collectives are ordered after torch's current
  // stream on this thread (autograd runs CUDA backward on its own device thread), and new
  // storages come from the engine's device.
  struct Scope {
    c10::OptionalDeviceGuard device;
    comm::ComputeStreamGuard stream;
    explicit Scope(Impl& m)
        : device(m.dev->is_cuda() ? c10::optional<c10::Device>(m.dev->device()) : c10::nullopt),
          stream(m.dev->compute_stream()) {}
  };

  // ---- transitions (schedule.cpp) --------------------------------------------------
  // The forward hook: pre-forward (unshard, prefetch), the body, post-forward (reshard,
  // register the pre-backward hook on the output).
  at::Tensor run_forward(Unit& u, const at::Tensor& input, const UnitBody& body);
  void pre_backward(Unit& u);
  // AccumulateGrad post hook of one of u's parameters.
  void on_param_ready(Unit& u);
  // Post-backward: queue u's reductions, reshard; idempotent (once per backward).
  void post_backward(Unit& u);
  // The end-of-backward callback: post-backward of units that got no gradient, retire every
  // reduction, average across replicas on the last micro-batch, every unit back to Idle.
  void end_backward();

  // ---- mechanics (schedule.cpp) ----------------------------------------------------
  void issue_gather(Unit& u, FlatParam& fp);
  // The all-gather of one flat: the plain one, or what ZeRO++ decides (zeropp.h).
  comm::WorkPtr gather_flat(Unit& u, FlatParam& fp, const at::Tensor& mine);
  void wait_gather(FlatParam& fp);
  void issue_unshard(Unit& u);
  void unshard(Unit& u);
  void reshard(Unit& u);
  Unit* backward_successor(const Unit& u) const;
  void prepare_grads(Unit& u);
  void reduce(Unit& u, size_t i);
  void retire(PendingReduce& p);
  void retire_reductions(size_t keep);
  void accumulate(FlatParam& fp, const at::Tensor& reduced);
  // Where a reduced gradient ends: added into the shard, or (reproducible) pushed as a leaf.
  void absorb(FlatParam& fp, const at::Tensor& reduced);
  // Reproducible, last micro-batch: each flat's leaf sum becomes its gradient shard.
  void finish_leaf_sums();
  void drain_d2h(size_t keep);
  void begin_backward();
  at::Tensor on_comm_device(const FlatParam& fp, const at::Tensor& t) const;
  void track_live();
  // Time the training thread spends blocked on collectives: the communication that
  // computation did not hide.
  void wait_timed(comm::Work& w);
};

}  // namespace shardtrain::fsdp
