// Counts CUDA devices through the runtime API when built with CUDA; 0 otherwise.
#include "shardtrain/runtime/topology.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace shardtrain::runtime {
int visible_cuda_devices() {
#ifdef SHARDTRAIN_HAVE_CUDA
  int n = 0;
  // No device (or no driver) is not an error here: the run falls back to CPU.
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
#else
  return 0;
#endif
}
}  // namespace shardtrain::runtime
