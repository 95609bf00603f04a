// save_checkpoint / load_checkpoint / verify_checkpoint: one parallel-HDF5 file per checkpoint.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardtrain/ckpt/meta.h"  // CheckpointMeta, read_checkpoint_meta
#include "shardtrain/ckpt/snapshot.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"

namespace shardtrain::ckpt {

// Everything besides parameters and optimizer state that a resumed run needs. Must be the
// same on every rank when saving (rank 0's copy is written); every rank gets it on load.
struct TrainState {
  int64_t step = 0;
  int64_t tokens_seen = 0;
  int64_t lr_step = 0;                // LR schedule position
  std::vector<int64_t> data_cursor;   // sampler position(s)
  std::vector<uint8_t> rng_state;     // serialized generator state(s)
  std::string extra_json = "{}";      // anything else, as a JSON object (loss scale, ...)
};

// Descriptive metadata written to the root attributes (not needed to load).
struct CheckpointInfo {
  std::string deck_text;        // the resolved deck
  std::string model_spec_json;  // the model spec as JSON
  std::string strategy;         // e.g. "hybrid_shard"
  int shard_group_size = 1, replicate_size = 1;
  // Ownership (docs/checkpoints.md "Runs and ownership"): the run that wrote the file and the
  // file's place in that run's sequence of saves (1, 2, ...), which orders "newest" for
  // rotation even when a run went back to an older step. "" / 0 = not recorded.
  std::string run_id;
  int64_t save_seq = 0;
  // An adapter run's frozen base, which its checkpoints identify instead of holding
  // (ckpt::BaseIdentity::json()); "" for a checkpoint of the whole model.
  std::string base_json;
};

struct SaveOptions {
  // Hybrid / no_shard: ranks holding the same shard each write 1/R of it (true) or only
  // the first of them writes it all (false). bench_ckpt compares both.
  bool split_replicas = true;
  // Write `path.tmp`, then rename (the atomic commit). False writes `path` directly.
  bool atomic = true;
  // Parameter and optimizer data: independent MPI-IO writes (false; each rank's piece of a
  // dataset is one contiguous file range, so no two-phase exchange is needed and ranks do not
  // wait for each other 3 x #params times) or collective ones (true). Metadata is always
  // collective. bench_ckpt compares both.
  bool collective_data = false;
  // A flush or clean-up of the file that takes longer than this ends the job (exit 5, with
  // the message first) instead of hanging: HDF5's collective metadata writes wait forever
  // when a write fails on some ranks only (see save.cpp). Generous: it also bounds the fsync
  // of the whole file. The default matches comm.timeout_s's.
  double stuck_seconds = 600;
};

struct IoStats {
  double seconds = 0;
  int64_t bytes = 0;  // parameter + optimizer bytes in the file (the whole model)
};

// Collective over `world` (every rank of the engine's groups). Writes path.tmp with
// MPI-IO collective transfers, closes it on all ranks, then rank 0 renames it to `path`
// and fsyncs the directory. Throws on every rank if it fails anywhere it can detect.
IoStats save_checkpoint(const std::string& path, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt,
                        const TrainState& state, const CheckpointInfo& info, MPI_Comm world,
                        const SaveOptions& opts = {});
// The same from a snapshot (views or staged copies); what the async writer calls.
IoStats save_snapshot(const std::string& path, const Snapshot& snap, const TrainState& state,
                      const CheckpointInfo& info, MPI_Comm world, const SaveOptions& opts = {});

// Collective. Reads this rank's slices of every parameter and state of the engine's
// current layout (any world size / strategy wrote the file), after validating format,
// shapes, dtypes and the digests; then marks parameters updated. A bad file ends every
// rank with one UserError naming the file and dataset; nothing is modified in that case
// except (for digest failures found after reading) the shards, which are then garbage.
struct LoadOptions {
  // Read into host buffers, then copy into the shards (always done for shards in device
  // memory; set here, host runs take the same path: how the tests check it without a GPU).
  bool staged = false;
};
IoStats load_checkpoint(const std::string& path, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt,
                        TrainState& state, MPI_Comm world, const LoadOptions& lo = {});

// Collective. The /model datasets of the parameters `wanted` picks into the engine's masters
// (their other slots, and every other dataset of the file, untouched), digests checked, no
// optimizer or training state read: a checkpoint of a whole model as the base of an adapter model.
void load_model_parameters(const std::string& path, fsdp::Engine& engine, MPI_Comm world,
                           const std::function<bool(const std::string&)>& wanted);

// One process (no MPI-IO): the /train group alone (step, cursor, generator states, extra),
// checksums checked. What a resume inspects before it loads any weights. UserError naming
// the file if it is unreadable.
TrainState read_train_state(const std::string& path);

// Collective. Structure, every dataset's digest (the ranks split the reading) and, for the
// float32 datasets, that no value is NaN or Inf (a diverged run's state restores nothing useful).
// UserError naming the file and the first bad dataset.
void verify_checkpoint(const std::string& path, MPI_Comm world);

}  // namespace shardtrain::ckpt
