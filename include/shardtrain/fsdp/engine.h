// Engine: turns a module tree into FSDP units and runs the sharded forward/backward.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/flat_param.h"
#include "shardtrain/fsdp/limits.h"
#include "shardtrain/fsdp/options.h"
#include "shardtrain/fsdp/wrap.h"

namespace shardtrain::fsdp {

// Fills a full, fp32 parameter (its logical shape) for a qualified name. Called once per
// parameter, one unit at a time, with the same values whatever the world size.
using InitFn = std::function<void(const std::string& name, at::Tensor& full_fp32)>;

// The communicators a strategy uses. shard: the FSDP group over which parameters are
// sharded (nullptr = 1 rank, nothing sharded); replicate: the group across which the
// gradient shards are averaged after the last micro-batch (nullptr = none); world: all
// data-parallel ranks (for ignored parameters). shard_rs, if given, runs the gradient
// reduce-scatters on its own thread so they overlap the prefetch all-gathers.
struct EngineComms {
  comm::Comm* shard = nullptr;
  comm::Comm* shard_rs = nullptr;
  comm::Comm* replicate = nullptr;
  comm::Comm* world = nullptr;
  // The ranks of this rank's node (the mesh's shard group), for full_shard's secondary shards
  // (Compression::secondary_shards); nullptr otherwise.
  comm::Comm* node = nullptr;
};

// Bytes by category on this rank, from the engine's own bookkeeping.
struct MemoryStats {
  int64_t master_bytes = 0;         // fp32 parameter shards of trainable flats (incl. ignored, kept whole)
  int64_t grad_bytes = 0;           // fp32 gradient shards (trainable flats only)
  int64_t frozen_bytes = 0;         // frozen shards, in their compute dtype (FlatParam::frozen)
  int64_t live_unsharded_bytes = 0; // unsharded parameter buffers allocated now
  int64_t peak_unsharded_bytes = 0; // their peak since reset_peaks()
  int64_t live_grad_buffer_bytes = 0;  // unsharded gradient buffers allocated now
  int64_t peak_grad_buffer_bytes = 0;
  int max_all_gathers_in_flight = 0;
  int64_t live_secondary_bytes = 0;  // secondary (intra-node) shards kept after forward (hpZ)
  int64_t peak_secondary_bytes = 0;
  double exposed_comm_seconds = 0;  // training thread blocked on collectives, cumulative
  // From the CUDA caching allocator of the engine's device (everything the process allocated
  // there, not only the engine's buffers): torch.cuda.memory_allocated / max_memory_allocated.
  // -1 on a CPU device.
  int64_t device_allocated_bytes = -1;
  int64_t device_peak_allocated_bytes = -1;
};

// What the engine's collectives sent, and what the accuracy guard of the quantized collectives
// found. Bytes: what this rank sends under the ring model of each collective
// (comm::ring_bytes_sent), counted between nodes when the rank's successor in the group's ring
// lives on another host; cumulative.
struct CommStats {
  int64_t intra_node_bytes = 0;
  int64_t inter_node_bytes = 0;
  int64_t guard_checks = 0;        // guard evaluations so far (weights and gradients)
  double weight_rel_error = -1;    // the last guard step's largest relative error (-1: none yet)
  double grad_rel_error = -1;
  int weight_fallbacks = 0;        // flats whose weight gather fell back to full precision
  int grad_fallbacks = 0;          // flats whose replica average fell back to full precision
  // DiLoCo (parallel.replica_sync = "diloco"): outer steps of the whole model so far (fragment
  // 0's, one per cycle) and fragment syncs (each fragment's outer step counts once).
  int64_t outer_steps = 0;
  int64_t fragment_syncs = 0;
  // DiLoCo's int8 / int4 outer average under the accuracy guard: the last guard check's relative
  // error (-1: none yet) and the fragments fallen back to fp32.
  double outer_rel_error = -1;
  int outer_fallbacks = 0;
};

// The accuracy guards' decisions (fsdp.quant_guard_every / _threshold): which flats' quantized
// weight gather and replica average (ZeRO++) and which DiLoCo fragments run in full precision
// since their guard fired, and the optimizer steps ZeRO++'s guard has counted (its guard steps
// are every guard_every-th of them). The same on every rank. A checkpoint keeps them in its train
// state (train/resume_state.h), so a resumed run decides as the uninterrupted one would.
struct GuardState {
  std::vector<uint8_t> weights, grads;  // per flat_params() entry; empty without ZeRO++ compression
  int64_t steps = 0;                    // ZeRO++'s optimizer steps
  std::vector<uint8_t> outer;           // per DiLoCo fragment; empty without DiLoCo
};

class Engine {
 public:
  // root must derive from fsdp::Hookable (it becomes the root unit); its parameters may
  // be on the meta device. Collective over the comms' groups: every rank wraps the same
  // model with the same options.
  Engine(torch::nn::Module& root, EngineComms comms, EngineOptions opts, const InitFn& init);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Before each micro-batch's forward: is this backward the last of the accumulation
  // window (then gradient shards are averaged across replicas at its end)?
  void set_last_micro_batch(bool last);
  // Zeroes the gradient shards (start of an accumulation window).
  void zero_grad();
  // Global L2 norm of the gradient over the whole model, correct across shards, replicas
  // and ignored parameters; scales gradients by min(1, max_norm/(norm+1e-6)) when
  // max_norm > 0. Collective. Returns the norm before clipping. Under opts.reproducible the
  // sum of squares is exact, so the norm's bits do not depend on the sharding.
  double clip_grad_norm(double max_norm);

  // Every flat parameter this rank holds (units' in order, then the ignored group).
  std::vector<FlatParam*> flat_params();
  // What the engine runs with (the device with its index: cuda -> cuda:0).
  const EngineOptions& options() const;
  int num_units() const;
  // The plan each unit was built from (fsdp::plan_units), in unit order.
  const std::vector<UnitPlan>& layout() const;
  // Names of the modules that became units, in wrap order (root first).
  std::vector<std::string> unit_names() const;
  // Unsharded parameter bytes currently allocated by unit i (0 when resharded).
  int64_t unit_live_bytes(int i) const;
  MemoryStats memory() const;
  CommStats comm_stats() const;
  // Error-feedback residuals of the quantized gradient reduction (fsdp.quantize_grads): what a
  // checkpoint carries for an exact resume, as extra per-flat states named "qgz_residual.r<k>",
  // k < R replicas; entry [flat][k] is replica k's residual of this rank's shard (fp32
  // [shard_numel], host memory), the same on every replica. Empty without quantize_grads.
  std::vector<std::string> residual_names() const;
  // The host copies, kept by the engine: gather = true all-gathers the residuals across the
  // replicate groups into them (collective; before a save), false only sizes them (a load's
  // destination).
  std::vector<std::vector<at::Tensor>>& residual_staging(bool gather);
  // After a load into residual_staging(false): each rank takes its replica's residual (and
  // the quantized copies of the masters are made again).
  void load_residuals();
  // DiLoCo (options().replica_sync.diloco()): after the inner optimizer's step `step` (1-based:
  // the inner steps taken so far), the outer step of every fragment due at it (OuterSync::due).
  // Collective over the replicate group. Returns the fragments synced, in order; nothing (and
  // no communication) under every_step.
  std::vector<int> sync_replicas(int64_t step);
  // DiLoCo's checkpoint state (docs/strategies.md#checkpoints-under-diloco). Mid-cycle the
  // replicas' masters and inner optimizer states differ, while a checkpoint's datasets are the
  // same on every replica: the model a checkpoint holds is the outer copy, and each replica's own
  // state is kept as extra per-flat states after the optimizer's, named (for optimizer states
  // `opt_states`, R replicas): "diloco.outer_momentum", "diloco.local.r<k>" (replica k's master),
  // "<state>.r<k>" (replica k's inner optimizer state), k < R. Empty under every_step.
  std::vector<std::string> diloco_state_names(const std::vector<std::string>& opt_states) const;
  // Per flat, host fp32 [shard_numel] tensors kept by the engine: [0] the outer copy (the
  // checkpoint's model), then one per diloco_state_names entry. gather = true fills them
  // (collective over the replicate group: every replica's master and optimizer state; before a
  // save); false only sizes them (a load's destination). opt_state(flat, s): the optimizer's state
  // tensor s of a flat (ShardedOptimizer::state_tensor).
  using OptStateFn = std::function<at::Tensor(size_t flat, size_t state)>;
  std::vector<std::vector<at::Tensor>>& diloco_staging(const OptStateFn& opt_state, size_t opt_states, bool gather);
  // After a load: the masters hold the checkpoint's model (the outer copy) and the optimizer its
  // base states; present[j]: whether diloco_state_names()[j] was in the file (read into the
  // staging). The outer copy := the masters; the momentum from the file or zeros; when every
  // replica's local state is there for this replica count, each replica takes its own master and
  // optimizer state (an exact resume mid-cycle); otherwise every replica starts from the outer
  // copy with the base optimizer state (replica 0's).
  void load_diloco(const OptStateFn& opt_state, size_t opt_states, const std::vector<bool>& present);
  // The guards' state now, and after a load the checkpoint's given back. restore_guard_state
  // takes each part whose length matches this run's (flats, fragments) and returns what it did
  // not take, as a sentence for the resume log ("" when everything was taken).
  GuardState guard_state();
  std::string restore_guard_state(const GuardState& g);
  // After NF4 flats were written slice by slice (FlatParam::write_values without the whole absmax,
  // as a safetensors load does): double-quantizes their statistics, each flat's absmax gathered
  // over its shard group. Collective over the shard groups; nothing to do without such flats.
  void finish_nf4();
  // Also resets the device allocator's peak (max_memory_allocated).
  void reset_peaks();
  // The device the engine computes on (options().device, with an index for CUDA).
  const c10::Device& device() const;

  // Internal, used by the hooks in src/fsdp.
  struct Impl;

 private:
  double exact_grad_norm();
  double fast_grad_norm();
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardtrain::fsdp
