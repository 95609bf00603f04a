// OuterSync: DiLoCo's state and its outer step (EngineOptions::replica_sync with
// ReplicaSyncMode::DiLoCo; docs/strategies.md#diloco-replicas-that-synchronise-rarely). Per flat shard the outer copy (the master
// at the fragment's last sync) and the outer momentum, fp32, sharded exactly like the masters and
// the optimizer state. The units are cut into `fragments` consecutive fragments; fragment f takes
// its outer step after the inner steps s >= 1 with s = offset_f (mod H), offset_f = f * H / F:
// the outer gradient (outer copy - master) is averaged across the replicate group, one
// collectives.h wire_average per flat in diloco.outer_dtype's WireFormat, the outer SGD (optim/outer_sgd.h) moves the outer
// copy and every replica's master restarts from it. With overlap_steps = tau > 0 the average is
// issued after step s and applied after step s + tau (the inner steps meanwhile run on): the
// outer copy takes the outer step, and the replica keeps the progress it made since the issue,
// master = outer_new + (master_now - master_at_issue). The engine calls it after each inner step
// (Engine::sync_replicas) with explicit communicators and its timed wait; nothing here knows the
// engine's internals.
// Quantized outer gradients (int8 / int4) have ZeRO++'s accuracy guard (fsdp.quant_guard_every,
// fsdp.quant_guard_threshold): every guard_every-th sync of a fragment (its 0th, k-th, ...) also
// computes the exact fp32 average; the relative error over the fragment (summed over the shard
// group, so every rank decides the same) is recorded, and above the threshold the fragment
// takes the exact average at that sync and runs in fp32 from then on (one warning). The
// fallbacks travel in checkpoints (Engine::guard_state), so a resumed run keeps them.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/flat_param.h"
#include "shardtrain/fsdp/options.h"
#include "collectives.h"

namespace shardtrain::fsdp {

class OuterSync {
 public:
  // flats_by_unit: every unit's flats, in unit order (root first, the ignored group last);
  // replicate: the replicate group (nullptr or size 1: one replica, the outer step still runs on
  // its own change); shard: the shard group (nullptr or size 1: none), over which the guard's
  // error terms are summed; comm_device: where both reduce; tree: train.reproducible's fixed
  // sums; c: the quantization block and the accuracy guard's settings.
  OuterSync(const ReplicaSync& rs, const Compression& c, const std::vector<std::vector<FlatParam*>>& flats_by_unit,
            comm::Comm* replicate, comm::Comm* shard, const c10::Device& comm_device, bool tree);
  int fragments() const { return rs_.fragments; }
  // The cycle offset of fragment f: f * inner_steps / fragments.
  int64_t offset(int f) const;
  // Whether fragment f takes its outer step after inner step `step` (1-based).
  bool due(int f, int64_t step) const;

  // After inner step `step`: first the overlapped averages due now are applied (issue order);
  // then every fragment due issues its average (tau = 0: waited through `wait` and applied at
  // once). Returns the fragments whose sync started at this step.
  std::vector<int> step(int64_t step, const std::function<void(comm::Work&)>& wait);

  // tau > 0, checkpoints: every average in flight is waited for (not applied: that stays at its
  // due step). Then flat i's pending average (zeros when its fragment has none) and its master at
  // the issue (this replica's), for a save; and after a load, both given back: a fragment with a
  // pending average at the saved step (derived from the schedule at the next step()) continues
  // from them. restore(false): nothing was saved (the averages in flight are dropped).
  void finish_in_flight(const std::function<void(comm::Work&)>& wait);
  at::Tensor pending_average(size_t i) const;
  at::Tensor issued_master(size_t i) const;
  void restore(bool saved, const std::vector<at::Tensor>& averages, const std::vector<at::Tensor>& issued);
  // Waits for every average in flight (the engine's destructor: the works use their tensors).
  void wait_all();

  // Checkpoints: flat i's outer copy and momentum (fp32 [shard_numel], on the masters' device).
  size_t num_flats() const { return flats_.size(); }
  at::Tensor& outer(size_t i) { return flats_.at(i).outer; }
  at::Tensor& momentum(size_t i) { return flats_.at(i).momentum; }
  // Up to the last step given to step(): fragment syncs (each fragment's outer step counts once)
  // and outer steps of the whole model (fragment 0's, one per cycle). Functions of the step
  // count, so a resumed run continues them.
  int64_t fragment_syncs() const;
  int64_t outer_steps() const { return last_step_ / rs_.inner_steps; }
  // The accuracy guard: the last guard check's relative error (-1: none yet), the checks so
  // far and the fragments fallen back to fp32.
  double guard_rel_error() const { return guard_rel_error_; }
  int64_t guard_checks() const { return guard_checks_; }
  int fallbacks() const;
  // Per fragment: whether it fell back (checkpoints); restore_fallbacks takes one per fragment.
  std::vector<uint8_t> fallback_flags() const { return {fallback_.begin(), fallback_.end()}; }
  void restore_fallbacks(const std::vector<uint8_t>& flags);

 private:
  struct PerFlat {
    FlatParam* fp = nullptr;
    int fragment = 0;
    at::Tensor outer, momentum;
  };
  // One fragment's average in flight (or done), to be applied at `due`.
  struct Pending {
    int fragment = 0;
    int64_t due = 0;
    std::vector<size_t> flats;        // indices into flats_
    std::vector<at::Tensor> issued;   // tau > 0: each flat's master at the issue
    std::vector<WireAverage> avgs;    // per flat, in flight (empty: one replica, or restored)
    std::vector<at::Tensor> result;   // per flat: the average once done
    bool guard = false;               // an accuracy-guard sync (avgs issued with `exact`)
    bool done = false;
  };
  // Which sync of fragment f step is (0 = its first).
  int64_t first_sync(int f) const;  // the first step fragment f syncs after
  int64_t sync_index(int f, int64_t step) const;
  Pending issue(int f, int64_t step);
  void complete(Pending& p, const std::function<void(comm::Work&)>& wait);
  void apply(const Pending& p);
  std::deque<Pending> pending_;
  // From a checkpoint: per flat the pending average and master at issue; turned into Pending
  // entries at the next step() (which knows the step count).
  std::vector<at::Tensor> restored_avg_, restored_issued_;
  ReplicaSync rs_;
  std::vector<PerFlat> flats_;
  Compression c_;
  std::vector<bool> fallback_;  // per fragment: fell back to fp32
  double guard_rel_error_ = -1;
  int64_t guard_checks_ = 0;
  comm::Comm* replicate_ = nullptr;
  comm::Comm* shard_ = nullptr;
  c10::Device comm_device_;
  bool tree_ = false;
  int64_t last_step_ = 0;
};

}  // namespace shardtrain::fsdp
