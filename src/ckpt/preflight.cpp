// Start-up checks: writable directories, a regular `latest`, room for one checkpoint.
#include "shardtrain/runtime/topology.h"
#include "shardtrain/ckpt/preflight.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "shardtrain/runtime/agree.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::ckpt {

int64_t estimated_file_bytes(int64_t data_bytes, int64_t datasets, int64_t text_bytes) {
  // Measured on HDF5 1.10.8 (libver v18, dense root attributes): the tiny test GPT's file is
  // 470943 bytes for 416256 bytes of data in 86 datasets, i.e. ~0.5 KiB per dataset (object
  // header, digest attribute, link) plus the root's attributes, groups and heaps. Twice that
  // per dataset, the text twice and 64 KiB: the estimate is a reservation, and HDF5's
  // truncate at close gives back what it overshoots.
  return data_bytes + datasets * 1024 + 2 * text_bytes + (64 << 10);
}

int64_t estimated_checkpoint_bytes(fsdp::Engine& engine, fsdp::ShardedOptimizer& opt, const CheckpointInfo& info) {
  // The layout only (no data pointers): works for shards in device memory too.
  // The model, the optimizer's states and the engine's own (residuals, DiLoCo's replica states);
  // a frozen flat has its parameters only, and an adapter run's checkpoint leaves it out.
  const int64_t arrays = 1 + static_cast<int64_t>(opt.state_names().size() + engine.residual_names().size() +
                                                  engine.diloco_state_names(opt.state_names()).size());
  int64_t values = 0, datasets = 0;
  for (fsdp::FlatParam* fp : engine.flat_params()) {
    if (fp->frozen() && !engine.options().checkpoint_frozen) continue;
    const int64_t n = fp->frozen() ? 1 : arrays;
    values += fp->numel() * n;
    datasets += static_cast<int64_t>(fp->slots().size()) * n;
  }
  // + the data cursor and RNG states: a few KiB per rank at most, inside the margin below.
  return estimated_file_bytes(values * 4, datasets + 2,
                              static_cast<int64_t>(info.deck_text.size() + info.model_spec_json.size() + info.base_json.size()));
}

void check_writable_dir(const std::string& dir, const std::string& what) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    throw UserError(what + " " + dir + ": " + io::errno_text(errno));
  if (!S_ISDIR(st.st_mode)) throw UserError(what + " " + dir + " is not a directory");
  // A real file, written and removed: access(W_OK) is always true for root and ignores
  // read-only mounts; a full disk refuses even the one block of the probe.
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string probe = dir + "/.shardtrain-probe-" + host + "-" + std::to_string(::getpid());
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError(what + " " + dir + " is not writable: " + io::errno_text(errno));
  int err = ::write(fd, "probe\n", 6) == 6 ? 0 : (errno ? errno : EIO);
  if (::close(fd) != 0 && err == 0) err = errno;
  ::unlink(probe.c_str());
  if (err) throw UserError(what + " " + dir + " is not writable: " + io::errno_text(err));
}

void preflight(const std::string& checkpoint_dir, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt,
               const CheckpointInfo& info, MPI_Comm world) {
  int rank = 0;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  // Every rank opens the checkpoint file for writing, so every host must be able to write
  // the directory; one probe per host (not per rank) keeps a large job's metadata load small.
  const int node_rank = runtime::real_host_ranks(world).rank;
  const int64_t need = estimated_checkpoint_bytes(engine, opt, info);
  runtime::run_agreed(world, [&] {
    if (node_rank == 0) check_writable_dir(checkpoint_dir, "checkpoint.dir");
    if (rank != 0) return;
    for (const char* name : {"latest", "latest.tmp"}) {
      const std::string p = checkpoint_dir + "/" + name;
      struct stat st {};
      if (::lstat(p.c_str(), &st) != 0) continue;  // absent: written at the first checkpoint
      // A symlink to a regular file would do for reading, but the commit replaces `latest` by
      // rename: a link is then silently replaced, a directory makes the rename fail.
      if (!S_ISREG(st.st_mode))
        throw UserError(p + " is " + (S_ISDIR(st.st_mode) ? "a directory" : "not a regular file") +
                        ": the checkpoints' commit writes the newest file name there; remove it or use another "
                        "checkpoint.dir");
    }
    // Room for the next checkpoint next to the ones already there (rotation deletes the oldest
    // only after a new one is committed). statvfs may not know (f_blocks == 0): then skip.
    const int64_t avail = io::available_bytes(checkpoint_dir);
    const int64_t want = need + need / 10 + (64 << 10);
    if (avail >= 0 && avail < want)
      throw UserError("checkpoint.dir " + checkpoint_dir + " has too little free space for one checkpoint: " +
                      std::to_string(want) + " bytes needed (" + std::to_string(need) + " for the file + 10% + 64 KiB), " +
                      std::to_string(avail) + " available");
  });
}

}  // namespace shardtrain::ckpt
