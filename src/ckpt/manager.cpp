// CheckpointManager: commit protocol (rename, latest, rotation) and the resume decision.
#include "shardtrain/ckpt/manager.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "shardtrain/ckpt/async_writer.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"

namespace fs = std::filesystem;

namespace shardtrain::ckpt {
namespace {

int comm_rank(MPI_Comm c) {
  int r = 0;
  ST_MPI_CHECK(MPI_Comm_rank(c, &r));
  return r;
}

// Complete checkpoints (step_N.h5, not .tmp) in the directory, newest step first.
std::vector<std::pair<int64_t, std::string>> step_files(const std::string& dir, const char* suffix) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  const std::regex re(std::string("^step_([0-9]{1,18})") + suffix + "$");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    std::string name = e.path().filename().string();
    if (e.is_regular_file(ec) && std::regex_match(name, m, re)) out.emplace_back(std::stoll(m[1]), e.path().string());
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

std::string CheckpointManager::file_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "step_%08lld.h5", static_cast<long long>(step));
  return buf;
}

CheckpointManager::CheckpointManager(std::string dir, int keep_last, MPI_Comm world, bool async, SaveOptions opts)
    : dir_(std::move(dir)), keep_last_(keep_last), world_(world), opts_(opts) {
  runtime::run_agreed(world_, [&] {
    ST_USER_CHECK(keep_last_ >= 1, "checkpoint.keep_last must be at least 1, got ", keep_last_);
    ST_USER_CHECK(!dir_.empty(), "checkpoint directory is empty");
    if (comm_rank(world_) != 0) return;
    std::error_code ec;
    fs::create_directories(dir_, ec);
    ST_USER_CHECK(fs::is_directory(dir_), "cannot create checkpoint directory ", dir_,
                  ec ? ": " + ec.message() : std::string());
  });
  if (async) async_ = std::make_unique<AsyncWriter>(world_);
}

CheckpointManager::~CheckpointManager() = default;  // AsyncWriter's destructor joins

void CheckpointManager::wait() {
  if (async_) async_->wait();
}

std::string CheckpointManager::save(int64_t step, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt,
                                    const TrainState& state, const CheckpointInfo& info) {
  Timer stall;
  wait();
  const std::string path = (fs::path(dir_) / file_name(step)).string();
  if (async_) {
    const bool rank0 = comm_rank(world_) == 0;
    async_->start(path, staged_snapshot(engine, opt, staging_), state, info, opts_, [this, path, rank0] {
      if (rank0) commit(path);
    });
  } else {
    save_checkpoint(path, engine, opt, state, info, world_, opts_);
    runtime::run_agreed(world_, [&] {
      if (comm_rank(world_) == 0) commit(path);
    });
  }
  last_stall_s_ = stall.seconds();
  return path;
}

void CheckpointManager::commit(const std::string& final_path) {
  // latest: replaced atomically (latest.tmp, fsync, rename, fsync dir), only after the
  // checkpoint itself is in place. A failed write (disk full) is an IoError naming latest and
  // the reason; the old `latest` stays as it was.
  io::write_file_atomic((fs::path(dir_) / "latest").string(), fs::path(final_path).filename().string() + "\n");
  // Rotation: keep the newest keep_last complete files; drop stale partial writes.
  auto files = step_files(dir_, "\\.h5");
  std::error_code ec;
  for (size_t i = static_cast<size_t>(keep_last_); i < files.size(); ++i) {
    fs::remove(files[i].second, ec);
    log::info(log::fmt("checkpoint: removed ", files[i].second, " (keep_last ", keep_last_, ")"));
  }
  for (auto& [step, p] : step_files(dir_, "\\.h5\\.tmp"))
    if (p != final_path + ".tmp") fs::remove(p, ec);
}

std::optional<std::string> CheckpointManager::find_resume(const std::string& resume) {
  wait();
  return ckpt::find_resume(dir_, resume, world_);
}

std::optional<std::string> find_resume(const std::string& dir, const std::string& resume, MPI_Comm world) {
  if (resume == "never") return std::nullopt;
  const bool rank0 = comm_rank(world) == 0;
  if (resume != "auto") {
    verify_checkpoint(resume, world);  // UserError on every rank if missing or bad
    return resume;
  }
  // Rank 0 lists the directory; everyone then verifies the same candidates in order.
  std::string listing;
  if (rank0)
    for (auto& [step, p] : step_files(dir, "\\.h5")) listing += p + "\n";
  int64_t n = static_cast<int64_t>(listing.size());
  ST_MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT64_T, 0, world));
  listing.resize(static_cast<size_t>(n));
  ST_MPI_CHECK(MPI_Bcast(listing.data(), static_cast<int>(n), MPI_CHAR, 0, world));
  size_t pos = 0;
  while (pos < listing.size()) {
    size_t nl = listing.find('\n', pos);
    std::string candidate = listing.substr(pos, nl - pos);
    pos = nl + 1;
    try {
      verify_checkpoint(candidate, world);
      if (rank0) log::info("checkpoint: resuming from " + candidate);
      return candidate;
    } catch (const UserError& e) {
      if (rank0) log::warn(std::string("checkpoint: skipping ") + candidate + ": " + e.what());
    }
  }
  return std::nullopt;
}

}  // namespace shardtrain::ckpt
