// The loop position a checkpoint carries besides weights and optimizer state, and the
// conversion to and from ckpt::TrainState (step, tokens, data cursor, per-rank RNG states).
#pragma once
#include <c10/core/Device.h>
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/data/sampler.h"

namespace shardtrain::train {

struct LoopPosition {
  int64_t step = 0;         // optimizer steps completed (also the LR schedule position)
  int64_t tokens_seen = 0;
  data::SamplerCursor cursor;
};

// The generator is torch's default generator of the compute device (dropout draws from it:
// the CPU's, or the rank's GPU's Philox state).

// Seeds this rank's default generator of `device` from run.seed and the rank, so a fresh run
// is reproducible and ranks draw different masks.
void seed_default_generator(uint64_t seed, int rank, const c10::Device& device = c10::kCPU);

// Collective over world: every rank's generator state is gathered (ranks draw different
// dropout masks, so one state would not resume them exactly); the result is the same on
// every rank, as save_checkpoint requires.
// `guarantee`: train.reproducible's dependencies as JSON (leaf_plan.h), stored as extra
// "reproducible"; "" when the run is not reproducible.
ckpt::TrainState make_train_state(const LoopPosition& pos, int64_t global_batch, uint64_t seed, MPI_Comm world,
                                  const c10::Device& device = c10::kCPU, const std::string& guarantee = "");

// train.reproducible: before leaf `leaf` of step `step` (0-based: the step being computed), the
// default generator is seeded from (run.seed, step, leaf) alone, so dropout draws the same masks
// for the same samples at any world size.
void seed_leaf_generator(uint64_t seed, int64_t step, int64_t leaf, const c10::Device& device);

// No communication. Returns the position and restores this rank's generator: its own state
// when the checkpoint was written by as many ranks on the same kind of device, otherwise a
// reseed from (seed, rank, step) (only dropout can tell). `notes` gets lines worth printing
// (rank 0 prints them). UserError (naming `path`) when the state is malformed.
// `guarantee` (this run's, "" when not reproducible) is compared with the checkpoint's: each
// difference is a warning line in `notes`.
LoopPosition apply_train_state(const ckpt::TrainState& st, const std::string& path, int64_t global_batch,
                               uint64_t seed, int rank, int world_size, std::string& notes,
                               const c10::Device& device = c10::kCPU, const std::string& guarantee = "");

// The accuracy guards' state (fsdp::GuardState: fallbacks to full precision, ZeRO++'s step
// count) in a train state's extra JSON, key "guard": {"weights": [0/1 per flat], "grads": [...],
// "steps": N, "outer": [0/1 per DiLoCo fragment]}. Nothing is written when no guard runs.
void put_guard_state(ckpt::TrainState& st, const fsdp::GuardState& g);
// The checkpoint's, or nullopt when it holds none (no guard ran, or written before guards were
// saved). UserError naming `path` and the key when it is malformed.
std::optional<fsdp::GuardState> guard_state_of(const ckpt::TrainState& st, const std::string& path);

}  // namespace shardtrain::train
