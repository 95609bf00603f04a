// The fused AdamW kernel on a CUDA device: a grid-stride loop whose body is adamw_update
// (adamw_math.h), the same function the Kokkos kernel runs, with the decay decided per element
// by a binary search over the mask's bounds (one launch per shard instead of one per segment).
// Compiled with --fmad=false (CMake) so no multiply-add is fused: the device then performs the
// host's IEEE operations in the same order (sqrt and division are IEEE-rounded by default) and
// its results equal the Kokkos kernel's bit for bit (tested: gpu_adamw_cuda).
#include <cuda_runtime_api.h>

#include "shardtrain/optim/adamw_cuda.h"
#include "shardtrain/util/error.h"

namespace shardtrain::optim {
namespace {

__global__ void adamw_kernel(float* __restrict__ param, const float* __restrict__ grad,
                             float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq, int64_t n,
                             const int64_t* __restrict__ bounds, int64_t n_bounds, AdamWScalars s) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (n_bounds > 0 && in_decayed_range(bounds, n_bounds, i))
      adamw_update<true>(param[i], grad[i], exp_avg[i], exp_avg_sq[i], s);
    else
      adamw_update<false>(param[i], grad[i], exp_avg[i], exp_avg_sq[i], s);
  }
}

}  // namespace

bool adamw_cuda_built() { return true; }

void adamw_step_cuda(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                     const int64_t* bounds, int64_t n_bounds, const AdamWScalars& s, void* cuda_stream) {
  ST_CHECK(n >= 0, "negative shard length ", n);
  if (n == 0) return;
  ST_CHECK(param && grad && exp_avg && exp_avg_sq, "adamw_step_cuda given a null array");
  ST_CHECK(n_bounds == 0 || bounds, "adamw_step_cuda given bounds count ", n_bounds, " but no array");
  constexpr int kThreads = 256;
  // Enough blocks to fill any current GPU several times over; the loop strides over the rest.
  const int64_t want = (n + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(want < 65536 ? want : 65536);
  adamw_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
      param, grad, exp_avg, exp_avg_sq, n, bounds, n_bounds, s);
  const cudaError_t e = cudaGetLastError();
  ST_CHECK(e == cudaSuccess, "adamw_kernel launch failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

}  // namespace shardtrain::optim
