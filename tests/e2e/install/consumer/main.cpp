// ckpt_meta FILE: prints a checkpoint's step, strategy and library_versions, read with
// shardtrain::ckpt::read_checkpoint_meta (one process; MPI only initialised, as HDF5 is parallel).
#include <mpi.h>

#include <cstdio>
#include <exception>

#include "shardtrain/ckpt/meta.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ckpt_meta FILE\n");
    return 2;
  }
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    const shardtrain::ckpt::CheckpointMeta m = shardtrain::ckpt::read_checkpoint_meta(argv[1]);
    std::printf("step %lld\nstrategy %s\nversions %s\n", static_cast<long long>(m.step), m.strategy.c_str(),
                m.library_versions.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt_meta: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
