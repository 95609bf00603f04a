// AsyncWriter: one background save at a time on a duplicated communicator.
#include "shardtrain/ckpt/async_writer.h"

#include "shardtrain/runtime/agree.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::ckpt {

AsyncWriter::AsyncWriter(MPI_Comm world) : world_(world) {
  int provided = 0;
  ST_MPI_CHECK(MPI_Query_thread(&provided));
  ST_CHECK(provided == MPI_THREAD_MULTIPLE, "asynchronous checkpoints need MPI_THREAD_MULTIPLE");
  ST_MPI_CHECK(MPI_Comm_dup(world, &comm_));
  watch_ = comm::watch_regions_like(comm_, "checkpoint writer", world);
}

AsyncWriter::~AsyncWriter() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      log::error(std::string("background checkpoint failed: ") + e.what());
    }
  }
  watch_.reset();
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void AsyncWriter::start(std::string path, Snapshot snap, TrainState state, CheckpointInfo info, SaveOptions opts,
                        std::function<void()> after) {
  ST_CHECK(!thread_.joinable(), "a background checkpoint is still being written; call wait() first");
  error_ = nullptr;
  thread_ = std::thread([this, path = std::move(path), snap = std::move(snap), state = std::move(state),
                         info = std::move(info), opts, after = std::move(after)] {
    try {
      save_snapshot(path, snap, state, info, comm_, opts);
      after();
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void AsyncWriter::wait() {
  if (thread_.joinable()) thread_.join();
  std::exception_ptr e = std::exchange(error_, nullptr);
  runtime::run_agreed(world_, [&] {
    if (e) std::rethrow_exception(e);
  });
}

}  // namespace shardtrain::ckpt
