// OuterSync: DiLoCo's state and its outer step (EngineOptions::replica_sync with
// ReplicaSyncMode::DiLoCo; docs/strategies.md#diloco). Per flat shard the outer copy (the master
// at the fragment's last sync) and the outer momentum, fp32, sharded exactly like the masters and
// the optimizer state. The units are cut into `fragments` consecutive fragments; fragment f takes
// its outer step after the inner steps s >= 1 with s = offset_f (mod H), offset_f = f * H / F:
// the outer gradient (outer copy - master) is averaged across the replicate group
// (collectives.h's average_outer_gradients), the outer SGD (optim/outer_sgd.h) moves the outer
// copy and every replica's master restarts from it. The engine calls it after each inner step
// (Engine::sync_replicas) with explicit communicators and its timed wait; nothing here knows the
// engine's internals.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/flat_param.h"
#include "shardtrain/fsdp/options.h"

namespace shardtrain::fsdp {

class OuterSync {
 public:
  // flats_by_unit: every unit's flats, in unit order (root first, the ignored group last);
  // replicate: the replicate group (nullptr or size 1: one replica, the outer step still runs on
  // its own change); comm_device: where `replicate` reduces; tree: train.reproducible's fixed sums.
  OuterSync(const ReplicaSync& rs, const std::vector<std::vector<FlatParam*>>& flats_by_unit, comm::Comm* replicate,
            const c10::Device& comm_device, bool tree);

  // The fragment of unit u of `units`: u * fragments / units (consecutive, as even as can be).
  static int fragment_of(int unit, int units, int fragments);
  int fragments() const { return rs_.fragments; }
  // The cycle offset of fragment f: f * inner_steps / fragments.
  int64_t offset(int f) const;
  // Whether fragment f takes its outer step after inner step `step` (1-based).
  bool due(int f, int64_t step) const;

  // After inner step `step`: the outer step of every fragment due, in fragment order (each one
  // average, waited through `wait`). Returns the fragments synced.
  std::vector<int> step(int64_t step, const std::function<void(comm::Work&)>& wait);

  // Checkpoints: flat i's outer copy and momentum (fp32 [shard_numel], on the masters' device).
  size_t num_flats() const { return flats_.size(); }
  at::Tensor& outer(size_t i) { return flats_.at(i).outer; }
  at::Tensor& momentum(size_t i) { return flats_.at(i).momentum; }
  // Up to the last step given to step(): fragment syncs (each fragment's outer step counts once)
  // and outer steps of the whole model (fragment 0's, one per cycle). Functions of the step
  // count, so a resumed run continues them.
  int64_t fragment_syncs() const;
  int64_t outer_steps() const { return last_step_ / rs_.inner_steps; }

 private:
  struct PerFlat {
    FlatParam* fp = nullptr;
    int fragment = 0;
    at::Tensor outer, momentum;
  };
  void outer_step(int f, const std::function<void(comm::Work&)>& wait);
  ReplicaSync rs_;
  std::vector<PerFlat> flats_;
  comm::Comm* replicate_ = nullptr;
  c10::Device comm_device_;
  bool tree_ = false;
  int64_t last_step_ = 0;
};

}  // namespace shardtrain::fsdp
