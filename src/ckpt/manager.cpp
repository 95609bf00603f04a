// CheckpointManager: commit protocol (verify, rename, latest, rotation by ownership) and the
// resume decision (newest file of this run that verifies, bad ones set aside).
#include "shardtrain/ckpt/manager.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>

#include "shardtrain/ckpt/async_writer.h"
#include "shardtrain/ckpt/run_dir.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/small_file.h"
#include "shardtrain/util/timer.h"

namespace fs = std::filesystem;

namespace shardtrain::ckpt {
namespace {

int comm_rank(MPI_Comm c) {
  int r = 0;
  ST_MPI_CHECK(MPI_Comm_rank(c, &r));
  return r;
}

// Rank 0's list of names, the same on every rank.
std::vector<std::string> broadcast_lines(const std::vector<std::string>& lines, MPI_Comm world) {
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  runtime::broadcast(world, text, 0, "manager.list");
  std::vector<std::string> out;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    out.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

// Every master and optimizer-state value of every rank is finite (collective).
bool snapshot_finite(const Snapshot& s, MPI_Comm world) {
  int bad = 0;
  for (const FlatView& v : s.flats) {
    auto check = [&](const float* p) {
      for (int64_t i = 0; i < v.shard_numel && !bad; ++i) bad = !std::isfinite(p[i]);
    };
    if (v.master) check(v.master);
    for (const float* st : v.states) check(st);
    if (bad) break;
  }
  return !runtime::any_rank(world, bad != 0, "save.finite");
}

}  // namespace

std::string CheckpointManager::file_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "step_%08lld.h5", static_cast<long long>(step));
  return buf;
}

CheckpointManager::CheckpointManager(std::string dir, int keep_last, MPI_Comm world, bool async, SaveOptions opts,
                                     std::string run_id)
    : dir_(std::move(dir)), keep_last_(keep_last), world_(world), opts_(opts), run_id_(std::move(run_id)) {
  runtime::run_agreed(world_, [&] {
    ST_USER_CHECK(keep_last_ >= 1, "checkpoint.keep_last must be at least 1, got ", keep_last_);
    ST_USER_CHECK(!dir_.empty(), "checkpoint directory is empty");
    if (comm_rank(world_) != 0) return;
    std::error_code ec;
    fs::create_directories(dir_, ec);
    ST_USER_CHECK(fs::is_directory(dir_), "cannot create checkpoint directory ", dir_,
                  ec ? ": " + ec.message() : std::string());
    // Continue this run's save sequence where its files in the directory left it.
    if (!run_id_.empty())
      for (const StepFile& f : list_step_files(dir_))
        if (f.run_id == run_id_) save_seq_ = std::max(save_seq_, f.save_seq);
  });
  runtime::broadcast(world_, save_seq_, 0, "manager.save_seq");
  if (async) async_ = std::make_unique<AsyncWriter>(world_);
}

CheckpointManager::~CheckpointManager() = default;  // AsyncWriter's destructor joins

void CheckpointManager::wait() {
  if (!async_) return;
  try {
    async_->wait();
  } catch (const Error&) {
    // Agreed on every rank: the background save failed; nothing of it may stay behind.
    if (comm_rank(world_) == 0 && !pending_tmp_.empty()) ::unlink(pending_tmp_.c_str());
    pending_tmp_.clear();
    throw;
  }
  pending_tmp_.clear();
}

std::string CheckpointManager::save(int64_t step, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt,
                                    const TrainState& state, const CheckpointInfo& info_in) {
  Timer stall;
  wait();
  const std::string path = (fs::path(dir_) / file_name(step)).string(), tmp = path + ".tmp";
  const bool rank0 = comm_rank(world_) == 0;
  CheckpointInfo info = info_in;
  info.run_id = run_id_;
  info.save_seq = run_id_.empty() ? 0 : save_seq_ + 1;
  // The rename, not save_snapshot, makes the file visible: after it has been verified.
  SaveOptions opts = opts_;
  opts.atomic = false;

  std::vector<std::vector<float>> direct_pool;
  Snapshot snap = async_ ? staged_snapshot(engine, opt, staging_)
                  : snapshot_in_host_memory(engine, opt) ? view_snapshot(engine, opt)
                                                         : staged_snapshot(engine, opt, direct_pool);
  if (!snapshot_finite(snap, world_)) {
    if (rank0)
      log::warn(log::fmt("checkpoint: step ", step, " not written: the weights or the optimizer state hold NaN/Inf "
                         "(a diverged run); the newest checkpoint stays the newest"));
    last_stall_s_ = stall.seconds();
    return "";
  }
  save_seq_ = info.save_seq;
  if (async_) {
    pending_tmp_ = tmp;
    async_->start(tmp, std::move(snap), state, info, opts, [this, tmp, path] { finish(tmp, path, async_->comm()); });
  } else {
    try {
      save_snapshot(tmp, snap, state, info, world_, opts);
      finish(tmp, path, world_);
    } catch (const Error& e) {
      if (!e.agreed()) throw;  // some ranks only: the job aborts, the .tmp is never read
      if (rank0) ::unlink(tmp.c_str());
      throw;
    }
  }
  last_stall_s_ = stall.seconds();
  return path;
}

void CheckpointManager::finish(const std::string& tmp, const std::string& final_path, MPI_Comm comm) {
  Timer t;
  try {
    verify_checkpoint(tmp, comm);
    last_verify_s_ = t.seconds();
  } catch (const UserError& e) {
    IoError err("checkpoint " + final_path + " not committed: the file just written does not verify (" + e.what() +
                "); it was removed and `latest` still names the previous checkpoint");
    err.set_agreed();
    throw err;
  }
  runtime::run_agreed(comm, [&] {
    if (comm_rank(comm) == 0) commit(final_path);
  });
}

void CheckpointManager::point_latest(const std::string& final_path) {
  // latest: replaced atomically (tmp + rename), only after the checkpoint itself is in place.
  // One that already names the file stays untouched: a resume (of a finished run, too) that
  // changes nothing rewrites nothing.
  const std::string latest = (fs::path(dir_) / "latest").string();
  const std::string text = fs::path(final_path).filename().string() + "\n";
  std::error_code ec;
  if (fs::is_regular_file(fs::symlink_status(latest, ec))) {
    try {
      if (read_small_file(latest, 4096, "latest") == text) return;
    } catch (const Error&) {
      // unreadable: replaced below
    }
  }
  io::write_file_atomic(latest, text);
}

void CheckpointManager::commit(const std::string& final_path) {
  const std::string tmp = final_path + ".tmp";
  io::commit_temp(tmp, final_path, "checkpoint");  // refuses a link or device planted at final_path
  point_latest(final_path);
  // Rotation: this run's files only, newest save first; the file just written is the newest.
  std::vector<StepFile> own;
  for (StepFile& f : list_step_files(dir_))
    if (f.readable && f.run_id == run_id_ && f.path != final_path) own.push_back(std::move(f));
  std::error_code ec;
  for (size_t i = static_cast<size_t>(keep_last_ - 1); i < own.size(); ++i) {
    fs::remove(own[i].path, ec);
    log::info(log::fmt("checkpoint: removed ", own[i].path, " (keep_last ", keep_last_, ")"));
  }
  // Partial writes of earlier attempts: never complete, never read.
  static const std::regex partial("^step_[0-9]{1,18}\\.h5\\.tmp$");
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, partial) && e.path().string() != tmp) fs::remove(e.path(), ec);
  }
}

std::optional<std::string> CheckpointManager::find_resume(const std::string& resume, const Accept& accept) {
  wait();
  if (resume == "never") return std::nullopt;
  const bool rank0 = comm_rank(world_) == 0;
  if (resume != "auto") {
    verify_checkpoint(resume, world_);  // UserError on every rank if missing or bad
    if (accept) accept(resume);
    return resume;
  }
  // Rank 0 lists this run's files (and those without an owner); all verify them in order.
  // Files that cannot even be opened come first: they can never be resumed, and verifying
  // them is how they get set aside with the reason.
  std::vector<std::string> names;
  if (rank0) {
    const std::vector<StepFile> files = list_step_files(dir_);
    for (const StepFile& f : files)
      if (!f.readable) names.push_back(f.path);
    for (const StepFile& f : files)
      if (f.readable && (f.run_id == run_id_ || f.run_id.empty())) names.push_back(f.path);
  }
  for (const std::string& candidate : broadcast_lines(names, world_)) {
    try {
      verify_checkpoint(candidate, world_);
      if (accept) accept(candidate);
      runtime::run_agreed(world_, [&] {
        if (!rank0) return;
        log::info("checkpoint: resuming from " + candidate);
        point_latest(candidate);
      });
      return candidate;
    } catch (const UserError& e) {
      // Renamed, not deleted: a file that looks bad here may be readable elsewhere, and it is
      // the user's to judge. Out of the step_N.h5 namespace, nothing will pick it again.
      runtime::run_agreed(world_, [&] {
        if (!rank0) return;
        std::string aside = candidate + ".bad";
        std::error_code ec;
        for (int i = 2; fs::exists(fs::symlink_status(aside, ec)); ++i) aside = candidate + ".bad." + std::to_string(i);
        if (std::rename(candidate.c_str(), aside.c_str()) != 0)
          throw IoError("cannot rename " + candidate + " to " + aside + ": " + std::strerror(errno));
        log::warn(std::string("checkpoint: skipping ") + candidate + ": " + e.what() + " (renamed to " + aside + ")");
      });
    }
  }
  return std::nullopt;
}

}  // namespace shardtrain::ckpt
