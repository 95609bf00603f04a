// MPI start-up with MPI_THREAD_MULTIPLE, and an abort that ends every rank.
#include "shardtrain/runtime/runtime.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "shardtrain/runtime/singleton_session.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::runtime {

Runtime::Runtime(int* argc, char*** argv) {
  int initialized = 0;
  ST_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    // A singleton's session directory is its own (Open MPI shares one between singletons).
    use_private_session_dir_if_singleton();
    int provided = 0;
    ST_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    owns_mpi_ = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      std::fprintf(stderr,
                   "error: this MPI library provides thread level %d, but shardtrain needs "
                   "MPI_THREAD_MULTIPLE (%d): collectives run on worker threads. Use an MPI "
                   "built with thread support (OpenMPI: --enable-mpi-thread-multiple).\n",
                   provided, MPI_THREAD_MULTIPLE);
      MPI_Abort(MPI_COMM_WORLD, kExitInternal);
    }
  }
  // Errors come back as codes so ST_MPI_CHECK can name the call.
  ST_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  ST_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  ST_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  set_error_rank(rank_);
  log::set_rank(rank_);
}

Runtime::~Runtime() {
  if (owns_mpi_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
    remove_private_session_dir();
  }
}

void Runtime::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // A singleton's private session directory stays behind an abort (MPI_Abort may still use it,
  // and its orted does); the next singleton start on this host removes it (singleton_session.h).
  if (initialized && !finalized) {
    // The launcher script watches for this line (jobscripts/run-training.sh): when mpirun cannot
    // reach a node to end its ranks, the script still ends the job with this code.
    std::fprintf(stderr, "shardtrain: aborting the job with exit code %d\n", code);
    std::fflush(stderr);
    // Time for mpirun's output forwarding to take this line (and the message before it): the
    // abort ends the ranks, and what is still in their pipes can be lost.
    ::usleep(500 * 1000);
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  remove_private_session_dir();  // MPI was never started: nothing uses it
  std::_Exit(code);
}

}  // namespace shardtrain::runtime
