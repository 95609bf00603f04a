// Snapshot: what a rank contributes to a checkpoint, as views of the live shards or host copies.
#pragma once
#include <cstdint>
#include <cstddef>
#include <string>
#include <vector>

#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"

namespace shardtrain::ckpt {

struct SlotView {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0, numel = 0;  // in the unsharded flat buffer
};

// One FlatParam as the checkpoint sees it: its layout and this rank's shard
// [shard_begin, shard_begin + shard_numel) of the padded flat buffer.
struct FlatView {
  size_t flat = 0;  // in engine.flat_params() (a checkpoint may leave frozen flats out)
  bool frozen = false;  // a frozen flat: parameters only, no optimizer or engine state (states empty)
  std::vector<SlotView> slots;
  int64_t numel = 0, padded = 0, shard_numel = 0, shard_begin = 0;
  int shard_rank = 0, shard_size = 1;
  float* master = nullptr;          // shard_numel floats
  std::vector<float*> states;       // one per optimizer state, shard_numel floats each
};

struct Snapshot {
  std::vector<FlatView> flats;
  std::string optimizer;                 // "adamw" | "sgd"
  std::vector<std::string> state_names;  // e.g. exp_avg, exp_avg_sq
  int64_t optimizer_steps = 0;
  // States from this index on are DiLoCo's (fsdp::Engine::diloco_state_names): a checkpoint
  // without them loads (an every_step checkpoint: no outer state yet).
  size_t optional_from = SIZE_MAX;
};

// Flat `index` of engine.flat_params() as a view: its layout, no data pointers, no states.
FlatView flat_view(const fsdp::FlatParam& fp, size_t index);

// A checkpoint holds the engine's flats but the frozen ones when the engine's options say so
// (EngineOptions::checkpoint_frozen = false: an adapter run); frozen flats carry parameters only.
// True when every master and optimizer state array is in host memory in fp32 (views are
// possible; a frozen flat kept in bf16 needs the staged copies).
bool snapshot_in_host_memory(fsdp::Engine& engine, fsdp::ShardedOptimizer& opt);
// Views into the engine's masters and the optimizer's state (no copy); host memory only.
// Loading writes through these pointers: it asks for Write access, which marks every flat's
// unsharded copy stale (FlatParam::write_master), so the next forward gathers what was loaded.
enum class SnapshotAccess { Read, Write };
Snapshot view_snapshot(fsdp::Engine& engine, fsdp::ShardedOptimizer& opt, SnapshotAccess access = SnapshotAccess::Read);
// Host copies of the same in `pool` (background writes while training continues; shards in
// device memory): grown as needed and reused across saves, so a save does not pay for fresh
// page faults. copy = false only sizes the buffers (a load's destination). The snapshot
// points into pool, which must outlive it.
Snapshot staged_snapshot(fsdp::Engine& engine, fsdp::ShardedOptimizer& opt, std::vector<std::vector<float>>& pool,
                         bool copy = true);
// Copies a staged snapshot's buffers into the masters and optimizer state (wherever they live).
void restore_staged(const Snapshot& s, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt);
// Bytes of parameter and state data the snapshot's datasets hold in the file (whole model).
int64_t snapshot_file_bytes(const Snapshot& s);

}  // namespace shardtrain::ckpt
