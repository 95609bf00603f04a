// CheckpointManager: step_XXXXXXXX.h5 files in a directory, `latest`, rotation, resume choice.
#pragma once
#include <mpi.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/ckpt/checkpoint.h"

namespace shardtrain::ckpt {

class AsyncWriter;

// Commit protocol (docs/checkpoint-format.md): write dir/step_N.h5.tmp, rename to
// dir/step_N.h5, fsync the directory, then replace dir/latest (tmp + rename) with the
// file name, then delete the oldest step files beyond keep_last and stale .tmp files.
class CheckpointManager {
 public:
  // Collective over world (creates the directory on rank 0; duplicates world for the
  // background writer when async).
  CheckpointManager(std::string dir, int keep_last, MPI_Comm world, bool async = false,
                    SaveOptions opts = {});
  ~CheckpointManager();  // waits for a background save (errors are logged, not thrown)
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Collective. Waits for the previous background save, then saves this step (in the
  // background when async: the shards are copied to host first, so training may go on).
  // Returns the final path.
  std::string save(int64_t step, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt, const TrainState& state,
                   const CheckpointInfo& info);
  // Collective. Waits for a background save; rethrows its error (on every rank).
  void wait();
  // Seconds the last save() blocked the caller.
  double last_stall_seconds() const { return last_stall_s_; }

  // resume: "never" -> nullopt; "auto" -> the newest step file that verifies (skipping
  // .tmp files; corrupt or truncated files are skipped with a warning saying why),
  // nullopt if none; anything else is a path that must exist and verify (UserError
  // otherwise). Collective; every rank gets the same answer.
  std::optional<std::string> find_resume(const std::string& resume);

  const std::string& dir() const { return dir_; }
  static std::string file_name(int64_t step);  // "step_00000100.h5"

 private:
  void commit(const std::string& final_path);  // rank 0: latest + rotation
  std::string dir_;
  int keep_last_;
  MPI_Comm world_;
  SaveOptions opts_;
  std::unique_ptr<AsyncWriter> async_;
  std::vector<std::vector<float>> staging_;  // host copies for the background writer, reused
  double last_stall_s_ = 0;
};

// Free-standing form of CheckpointManager::find_resume for a directory.
std::optional<std::string> find_resume(const std::string& dir, const std::string& resume, MPI_Comm world);

}  // namespace shardtrain::ckpt
