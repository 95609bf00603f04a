// GoogleTest main for the `gpu` tests (MPI, like mpi_gtest_main.cpp): when this machine or
// build cannot run the test (no GPU, a CPU libtorch, no NCCL), every rank exits 77, which CTest
// reports as skipped (SKIP_RETURN_CODE), with the reason on rank 0 -- unless a GPU is present or
// SHARDTRAIN_GPU_REQUIRED=1 (gpu_required.h): then every rank exits 1, a failure.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "gpu_required.h"
#include "shardtrain/runtime/runtime.h"

// Each gpu test defines this: an empty reason when it can run with this many ranks, else why not.
shardtrain::gputest::CannotRun gpu_test_skip_reason(int world_size);

namespace {
void quiet_other_ranks(int rank) {
  if (rank == 0) return;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
}
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  shardtrain::runtime::Runtime rt(&argc, &argv);
  // Every rank decides alike (same build; the device count is per node, and a GPU test needs a
  // device per rank): skip on all ranks if any rank must skip.
  namespace gt = shardtrain::gputest;
  const gt::CannotRun cannot = gpu_test_skip_reason(rt.size());
  int skip = cannot.why.empty() ? 0 : 1, any_skip = 0;
  int fail = skip && gt::must_fail(cannot) ? 1 : 0, any_fail = 0;
  MPI_Allreduce(&skip, &any_skip, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&fail, &any_fail, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_skip) {
    gt::CannotRun shown = cannot;
    if (shown.why.empty()) shown.why = "another rank cannot run it";
    return gt::cannot_run_exit(shown, any_fail != 0, rt.rank() == 0);
  }
  quiet_other_ranks(rt.rank());
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && rt.rank() == 0 && !failed) std::fprintf(stderr, "a test failed on another rank\n");
  return any;
}
