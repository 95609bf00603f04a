// software_versions(): the version line of shardtrain and the libraries it was built with.
#include "shardtrain/ckpt/versions.h"

#include <hdf5.h>
#include <mpi.h>
#include <torch/version.h>

#if SHARDTRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/device.h"
#include "shardtrain/util/version.h"

namespace shardtrain::ckpt {

std::string software_versions() {
  std::string s = std::string("shardtrain ") + version() + " (git " + git_revision() + "); libtorch " + TORCH_VERSION +
                  (fsdp::torch_built_with_cuda() ? " (CUDA)" : " (CPU)");
  // MPI_Get_library_version may be called before MPI_Init (MPI 3.0 section 8.1.1).
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(mpi, &len) == MPI_SUCCESS) {
    std::string line(mpi, static_cast<std::size_t>(len));
    s += "; " + line.substr(0, line.find_first_of(",\n"));
  }
  unsigned a = 0, b = 0, c = 0;
  if (H5get_libversion(&a, &b, &c) >= 0)
    s += "; HDF5 " + std::to_string(a) + "." + std::to_string(b) + "." + std::to_string(c) + " (parallel)";
#if SHARDTRAIN_HAVE_CUDA
  s += "; CUDA " + std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
#endif
  if (std::string nccl = comm::nccl_version_string(); !nccl.empty()) s += "; NCCL " + nccl;
  return s;
}

}  // namespace shardtrain::ckpt
