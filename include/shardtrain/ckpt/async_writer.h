// AsyncWriter: writes a staged snapshot on a background thread over a duplicated communicator.
#pragma once
#include <mpi.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/comm/watch_regions.h"

namespace shardtrain::ckpt {

// One save in flight at a time. The thread runs save_snapshot on `comm` (a duplicate of
// the world communicator, so the training thread's collectives never match its
// messages; MPI_THREAD_MULTIPLE is required and the runtime ensures it), then `after`
// (rename bookkeeping). HDF5 is not thread-safe in this build: nothing else may call
// HDF5 until wait() returns. When `world` is watched (comm::watch_regions), so is the
// duplicate: a save stuck in a collective (a cut link) ends the job after comm.timeout_s.
class AsyncWriter {
 public:
  explicit AsyncWriter(MPI_Comm world);  // collective: duplicates world
  ~AsyncWriter();                        // waits; logs an error it could not report
  void start(std::string path, Snapshot snap, TrainState state, CheckpointInfo info, SaveOptions opts,
             std::function<void()> after);
  // Collective over world: joins the thread and agrees on failure (throws on all ranks).
  void wait();
  bool busy() const { return thread_.joinable(); }
  MPI_Comm comm() const { return comm_; }

 private:
  MPI_Comm world_, comm_ = MPI_COMM_NULL;
  std::unique_ptr<comm::RegionWatch> watch_;  // of comm_, while it lives
  std::thread thread_;
  std::exception_ptr error_;
};

}  // namespace shardtrain::ckpt
