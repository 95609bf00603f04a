// main(): MPI up, parse the subcommand, run it; errors become one message and an exit code.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>

#include "command.h"
#include "shardtrain/ckpt/versions.h"
#include "shardtrain/runtime/blas_kernel.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/runtime/runtime.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/train/signals.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/error_text.h"
#include "shardtrain/util/log.h"

using namespace shardtrain;

namespace {
// Creates $SHARDTRAIN_READY_FILE on rank 0 after a barrier of all ranks. Best effort: a file
// that cannot be written only makes the job script wait its SHARDTRAIN_READY_WAIT.
void announce_ready(const runtime::Runtime& rt) {
  runtime::barrier(rt.world(), "ready");
  if (rt.rank() != 0) return;
  if (std::FILE* f = std::fopen(std::getenv("SHARDTRAIN_READY_FILE"), "w")) std::fclose(f);
}
}  // namespace

int main(int argc, char** argv) {
  int code = kExitOk;
  // What the command needs before MPI starts, as it declared when it registered (command.h).
  // A stop signal to `train` that lands during MPI start-up or deck loading must become
  // "checkpoint at the first step boundary, exit 42", not the default action (killing the rank,
  // which kills the job); the commands that compute run on the best GEMM kernel the CPU has,
  // chosen before MPI_Init and the first BLAS call (blas_kernel.h).
  const cli::CommandBeforeMpi command = cli::command_before_mpi(argc, argv);
  if (command.early_stop_signals) train::install_stop_signal_handlers();
  if (command.computes) runtime::select_blas_kernel();
  try {
    runtime::Runtime rt(&argc, &argv);
    CLI::App app{"shardtrain: fully sharded data-parallel training (FSDP / ZeRO-3, hybrid "
                 "sharding) as an MPI job"};
    app.require_subcommand(1);
    // One line: version, git revision, libtorch, MPI, HDF5 (and CUDA, NCCL when built with them).
    app.set_version_flag("--version", ckpt::software_versions());
    // `train` under jobscripts/run-training.sh: every rank is in MPI, so every rank's stop
    // handler is installed; rank 0 says so (the script holds a stop signal until then).
    if (command.early_stop_signals && std::getenv("SHARDTRAIN_READY_FILE")) announce_ready(rt);
    if (command.computes) {
      const runtime::BlasKernel& k = runtime::blas_kernel();
      if (!command.prints_kernel) log::info(k.line());
      if (!k.accurate) log::warn("the BLAS kernel failed its fp64 check: " + k.line());
    }
    train::register_model_choices();  // before any deck is read
    cli::CommandFn selected;
    for (const cli::RegisteredCommand& c : cli::registered_commands()) c.add(app, selected);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      // Every rank parses the same argv, so every rank reaches here together.
      if (rt.rank() == 0) {
        code = app.exit(e);
        if (const std::string hint = cli::parse_error_hint(e, argc, argv); !hint.empty()) std::fprintf(stderr, "%s\n", hint.c_str());
      } else {
        code = e.get_exit_code();
      }
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
    // A libtorch error without its stack trace (SHARDTRAIN_LOG=debug shows it).
    log::debug(e.what());
    log::error(error_text(e));
    runtime::Runtime::abort(kExitInternal);
  }
  return code;
}
