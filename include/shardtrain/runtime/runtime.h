// Runtime: MPI start-up and shut-down (RAII), with MPI_THREAD_MULTIPLE required.
#pragma once
#include <mpi.h>

namespace shardtrain::runtime {

// Owns MPI_Init_thread / MPI_Finalize. The comm layer runs collectives on worker
// threads and the watchdog queries peers from its own thread, so MPI must provide
// MPI_THREAD_MULTIPLE; anything less is a clear start-up error.
class Runtime {
 public:
  Runtime(int* argc, char*** argv);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm world() const { return MPI_COMM_WORLD; }

  // Ends every rank with `code` (MPI_Abort): used when ranks may disagree about failing.
  [[noreturn]] static void abort(int code);

 private:
  int rank_ = 0;
  int size_ = 1;
  bool owns_mpi_ = false;
};

}  // namespace shardtrain::runtime
