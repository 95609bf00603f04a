// Checkpointer: when the loop saves (every N steps, every M minutes, on a stop signal, at the
// end: SaveSchedule) and what it saves (weights, optimizer state and the loop position, through
// CheckpointManager); whether a stop signal ends the loop.
#pragma once
#include <c10/core/Device.h>
#include <mpi.h>

#include <cstdint>
#include <string>

#include "save_schedule.h"
#include "shardtrain/ckpt/manager.h"
#include "shardtrain/train/resume_state.h"

namespace shardtrain::train {

class Checkpointer {
 public:
  Checkpointer(ckpt::CheckpointManager& mgr, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt,
               ckpt::CheckpointInfo info, SaveSchedule schedule, int64_t global_batch, uint64_t seed,
               c10::Device device, int64_t resumed_step, MPI_Comm world);
  // At every step boundary (after validation: exactly where the next invocation's loop starts),
  // on what the step agreed (StepAgreed: no collective of its own). Saves (collective) when the
  // schedule says so. True when a stop signal ends the run here (the checkpoint is written;
  // exit 42) and training is not finished.
  bool after_step(const LoopPosition& pos, bool finished, const StepAgreed& agreed);
  const SaveSchedule& schedule() const { return schedule_; }
  // Collective, after the loop: the final checkpoint unless this step is saved already, then
  // waits for a background write. False when the final state could not be saved because it
  // is non-finite (train.on_nonfinite = "continue").
  bool finish(const LoopPosition& pos, bool save_final);
  int64_t last_saved() const { return last_saved_; }  // -1: none in this run
  // train.reproducible's dependencies, stored in every checkpoint's /train (leaf_plan.h).
  void record_guarantee(std::string json) { guarantee_ = std::move(json); }
  // data_identity.h's text, stored as /train extra "data" in every checkpoint.
  void record_data_identity(std::string json) { data_identity_ = std::move(json); }

 private:
  void save(const LoopPosition& pos, const std::string& why);
  ckpt::CheckpointManager& mgr_;
  fsdp::Engine& engine_;
  fsdp::ShardedOptimizer& opt_;
  ckpt::CheckpointInfo info_;
  SaveSchedule schedule_;
  int64_t global_batch_;
  uint64_t seed_;
  c10::Device device_;
  int64_t last_saved_;
  MPI_Comm world_;
  int rank_ = 0;
  std::string guarantee_, data_identity_;
};

}  // namespace shardtrain::train
