// GoogleTest main for MPI tests: MPI up, only rank 0 prints, failures on any rank fail all.
#include <gtest/gtest.h>
#include <mpi.h>

#include "shardtrain/runtime/runtime.h"

namespace {
// Silences every rank but 0 so the output reads like one process's.
void quiet_other_ranks(int rank) {
  if (rank == 0) return;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
}
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  shardtrain::runtime::Runtime rt(&argc, &argv);
  quiet_other_ranks(rt.rank());
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && rt.rank() == 0 && !failed) std::fprintf(stderr, "a test failed on another rank\n");
  return any;
}
