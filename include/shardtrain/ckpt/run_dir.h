// Who owns a checkpoint directory: run ids, the directory's run record, the exclusive lock a
// live job holds on its directories, the step files a directory holds, and moving another
// run's files aside. All of it is rank 0's business (plain POSIX, no MPI); callers broadcast.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace shardtrain::ckpt {

// A new run id: UTC start time plus 32 random bits, e.g. "20261201T184500Z-3fa2c1d9".
std::string new_run_id();

// `<checkpoint dir>/run.json`: the run that owns the directory's checkpoints.
struct RunRecord {
  std::string run_id;
  std::string started;  // UTC, ISO 8601
  std::string host, job_id;
  int64_t pid = 0;
};
// nullopt if the directory has no record; UserError naming the file if it is malformed.
std::optional<RunRecord> read_run_record(const std::string& dir);
// Atomic (tmp + rename + directory fsync). IoError naming the file if it cannot be written.
void write_run_record(const std::string& dir, const RunRecord& r);
RunRecord this_process_record(const std::string& run_id);  // host, pid, SLURM_JOB_ID, now

// One `step_N.h5` of a directory and the root attributes that say whose it is. `readable` is
// false when the file cannot be opened as a checkpoint (its owner is then unknown).
struct StepFile {
  int64_t step = 0;
  std::string path;
  bool readable = false;
  std::string run_id;    // "" = written before checkpoints carried run ids (or unreadable)
  int64_t save_seq = 0;  // position in its run's sequence of saves (1, 2, ...); 0 = unknown
};
// Complete checkpoints (`step_N.h5`, not `.tmp`), newest first: by save_seq, then step.
std::vector<StepFile> list_step_files(const std::string& dir);

// An exclusive lock on `<dir>/shardtrain.lock` (POSIX record lock, which NFS supports),
// held until destruction; the file names the holder (host, pid, Slurm job, since when).
// acquire(): UserError naming the holder if a live process holds it. A lock file left by a job
// that died is taken over with a warning. Where the filesystem has no locks, the file's content
// decides: a holder on this host that is not alive is taken over, any other holder is refused.
class DirLock {
 public:
  static std::unique_ptr<DirLock> acquire(const std::string& dir, const std::string& what);
  ~DirLock();  // empties the file (never unlinks it: a waiting job may hold its inode) and unlocks
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  const std::string& path() const { return path_; }

 private:
  DirLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_;
};

// Moves `files` (paths inside `dir`) into `<dir>/previous-runs/<label>/` (created; a numbered
// suffix keeps an existing folder of that name untouched). Returns that folder. IoError naming
// the file that could not be moved.
std::string move_aside(const std::string& dir, const std::string& label, const std::vector<std::string>& files);

// `<dir>/previous-runs/<label>`, or `<label>.2`, `.3`, ... : the first name not in use.
std::string fresh_previous_run_dir(const std::string& dir, const std::string& label);

// Renames each of `paths` (files or folders) into `target` (created with its parents), keeping
// its name; a name already in `target` is never replaced. IoError naming the path that could
// not be moved.
void move_into(const std::string& target, const std::vector<std::string>& paths);

}  // namespace shardtrain::ckpt
