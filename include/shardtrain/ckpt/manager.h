// CheckpointManager: step_XXXXXXXX.h5 files in a directory, `latest`, rotation, resume choice.
#pragma once
#include <mpi.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/ckpt/checkpoint.h"

namespace shardtrain::ckpt {

class AsyncWriter;

// Commit protocol (docs/checkpoint-format.md): write dir/step_N.h5.tmp, verify it (every
// digest; no NaN/Inf), rename it to dir/step_N.h5, fsync the directory, then replace
// dir/latest (tmp + rename) with the file name, then rotate: of this run's files (run_id),
// keep the newest keep_last (by save sequence, the file just written always among them) and
// delete the older ones; files of other runs, files without a readable owner and stale .tmp
// files of nobody's are never touched (.tmp files are deleted: they are never complete).
class CheckpointManager {
 public:
  // Collective over world (creates the directory on rank 0; duplicates world for the
  // background writer when async). run_id: the run this job continues or starts (stamped
  // on every file it writes); "" = files without an owner (tests, benchmarks).
  CheckpointManager(std::string dir, int keep_last, MPI_Comm world, bool async = false,
                    SaveOptions opts = {}, std::string run_id = "");
  ~CheckpointManager();  // waits for a background save (errors are logged, not thrown)
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Collective. Waits for the previous background save, then saves this step (in the
  // background when async: the shards are copied to host first, so training may go on).
  // Returns the final path, or "" (with a warning) when the masters or the optimizer state
  // hold NaN/Inf: such a state restores nothing useful, so it is not written and the
  // previous checkpoint stays the newest. A file that fails its verification is removed
  // and an IoError (exit 5) raised on every rank; `latest` still names the previous file.
  std::string save(int64_t step, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt, const TrainState& state,
                   const CheckpointInfo& info);
  // Collective. Waits for a background save; rethrows its error (on every rank).
  void wait();
  // Seconds the last save() blocked the caller.
  double last_stall_seconds() const { return last_stall_s_; }
  // Seconds the verification of the last committed file took (part of the save; in the
  // background when async). 0 before the first commit.
  double last_verify_seconds() const { return last_verify_s_; }

  // resume: "never" -> nullopt; "auto" -> the newest step file of this run (or without an
  // owner) that verifies and that `accept` (collective; may be empty) does not reject with a
  // UserError: every file skipped on the way, and every step file that cannot be opened as a
  // checkpoint at all, is renamed to `step_N.h5.bad` with a warning saying why (it is never
  // deleted) and `latest` is pointed at the chosen file; nullopt if
  // none. Anything else is a path that must exist, verify and be accepted (UserError
  // otherwise; nothing renamed). Collective; every rank gets the same answer.
  using Accept = std::function<void(const std::string&)>;
  std::optional<std::string> find_resume(const std::string& resume, const Accept& accept = {});

  const std::string& dir() const { return dir_; }
  const std::string& run_id() const { return run_id_; }
  bool async() const { return async_ != nullptr; }
  static std::string file_name(int64_t step);  // "step_00000100.h5"

 private:
  void finish(const std::string& tmp, const std::string& final_path, MPI_Comm comm);  // verify, commit
  void commit(const std::string& final_path);  // rank 0: rename, latest, rotation
  void point_latest(const std::string& final_path);  // rank 0
  std::string dir_;
  int keep_last_;
  MPI_Comm world_;
  SaveOptions opts_;
  std::string run_id_;
  int64_t save_seq_ = 0;  // of the newest file of this run in the directory
  std::string pending_tmp_;  // a background save's .tmp, removed if it fails
  std::unique_ptr<AsyncWriter> async_;
  std::vector<std::vector<float>> staging_;  // host copies for the background writer, reused
  double last_stall_s_ = 0;
  double last_verify_s_ = 0;
};



}  // namespace shardtrain::ckpt
