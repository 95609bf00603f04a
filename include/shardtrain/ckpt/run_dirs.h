// claim_run_dirs: before a training job writes anything, it locks its output and checkpoint
// directories and decides which run it is (continuing the directory's run, or starting a new
// one), so two jobs never share a directory and one run's files never mix with another's.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "shardtrain/ckpt/run_dir.h"

namespace shardtrain::ckpt {

struct RunDirsRequest {
  std::string out_dir, checkpoint_dir;
  std::string resume;         // checkpoint.resume: auto | never | a path
  std::string previous_run;   // checkpoint.previous_run: error | move_aside
  std::string metrics_file;   // log.metrics_file (relative to out_dir; "" = none)
};

struct RunDirs {
  std::string run_id;
  bool new_run = false;  // a fresh id (nothing of this run in the directory before)
  std::string resume;    // the resume request to hand to CheckpointManager::find_resume
  std::string notes;     // lines for rank 0 to print
  std::vector<std::unique_ptr<DirLock>> locks;  // rank 0; held for the job's life
};

// Collective over world; run_agreed inside (UserError on every rank, exit 2, when a
// directory is in use by another job or holds another run's checkpoints that the request
// would mix with; nothing is written then). Rank 0 creates both directories, takes their
// locks and writes the run record. Decision (docs/checkpoints.md "Runs and ownership"):
// - resume = auto: the run that the directory's run.json names (its checkpoints, and those
//   without an owner, are the resume candidates); without a record, the run of the newest
//   checkpoint there; otherwise a new run.
// - resume = a path: that file's run continues if it is the directory's run; otherwise a new
//   run starts from that state.
// - resume = never: a new run.
// A new run where step files of other runs exist: error, or (previous_run = move_aside) they,
// `latest`, run.json and out_dir's metrics/summary move to previous-runs/<run id>/ first.
RunDirs claim_run_dirs(const RunDirsRequest& req, MPI_Comm world);

}  // namespace shardtrain::ckpt
