// main(): MPI up, parse the subcommand, run it; errors become one message and an exit code.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "command.h"
#include "shardtrain/ckpt/versions.h"
#include "shardtrain/runtime/blas_kernel.h"
#include "shardtrain/runtime/runtime.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/train/signals.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/mpi_check.h"

using namespace shardtrain;

namespace {
// Creates $SHARDTRAIN_READY_FILE on rank 0 after a barrier of all ranks. Best effort: a file
// that cannot be written only makes the job script wait its SHARDTRAIN_READY_WAIT.
void announce_ready(const runtime::Runtime& rt) {
  ST_MPI_CHECK(MPI_Barrier(rt.world()));
  if (rt.rank() != 0) return;
  if (std::FILE* f = std::fopen(std::getenv("SHARDTRAIN_READY_FILE"), "w")) std::fclose(f);
}
}  // namespace

int main(int argc, char** argv) {
  int code = kExitOk;
  // `train`: record SIGUSR1/SIGTERM from the first instruction on. A batch system's stop signal
  // that lands during MPI start-up or deck loading must become "checkpoint at the first step
  // boundary, exit 42", not the default action (killing the rank, which kills the job).
  const char* command = "";
  bool measure = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--measure") == 0) measure = true;
    if (argv[i][0] == '-' || *command) continue;
    command = argv[i];
    if (std::strcmp(argv[i], "train") == 0) train::install_stop_signal_handlers();
  }
  // The commands that compute run on the best GEMM kernel the CPU has: before MPI_Init and the
  // first BLAS call, this may switch OpenBLAS to a better core (blas_kernel.h).
  bool computes = false;
  for (const char* c : {"train", "maxbatch", "bench", "info"}) computes = computes || std::strcmp(command, c) == 0;
  computes = computes || (std::strcmp(command, "plan") == 0 && measure);
  if (computes) runtime::select_blas_kernel();
  try {
    runtime::Runtime rt(&argc, &argv);
    CLI::App app{"shardtrain: fully sharded data-parallel training (FSDP / ZeRO-3, hybrid "
                 "sharding) as an MPI job"};
    app.require_subcommand(1);
    // One line: version, git revision, libtorch, MPI, HDF5 (and CUDA, NCCL when built with them).
    app.set_version_flag("--version", ckpt::software_versions());
    // `train` under jobscripts/run-training.sh: every rank is in MPI, so every rank's stop
    // handler is installed; rank 0 says so (the script holds a stop signal until then).
    if (std::strcmp(command, "train") == 0 && std::getenv("SHARDTRAIN_READY_FILE")) announce_ready(rt);
    if (computes) {
      const runtime::BlasKernel& k = runtime::blas_kernel();
      if (std::strcmp(command, "info") != 0) log::info(k.line());
      if (!k.accurate) log::warn("the BLAS kernel failed its fp64 check: " + k.line());
    }
    train::register_model_choices();  // before any deck is read
    cli::CommandFn selected;
    for (auto& [name, add] : cli::registered_commands()) add(app, selected);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      // Every rank parses the same argv, so every rank reaches here together.
      if (rt.rank() == 0) code = app.exit(e);
      else code = e.get_exit_code();
      return code == 0 ? 0 : kExitUserInput;
    }
    try {
      code = selected ? selected(rt) : kExitOk;
    } catch (const Error& e) {
      if (!e.agreed()) throw;
      // All ranks hold this error: print once, leave MPI cleanly.
      if (rt.rank() == 0) log::error(e.what());
      code = e.exit_code();
    }
  } catch (const Error& e) {
    // Raised on some ranks only: the others may be waiting in a collective; abort all.
    log::error(e.what());
    runtime::Runtime::abort(e.exit_code());
  } catch (const std::exception& e) {
    log::error(e.what());
    runtime::Runtime::abort(kExitInternal);
  }
  return code;
}
