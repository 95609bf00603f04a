// The fused AdamW step on a CUDA device, for builds whose Kokkos has no device backend (Debian's
// is Serial-only): one kernel launch per shard, same semantics and the same per-element code as
// the Kokkos kernel (adamw_math.h), raw device pointers, no libtorch or CUDA headers here.
#pragma once
#include <cstdint>

#include "shardtrain/optim/adamw_math.h"

namespace shardtrain::optim {

// True when this build compiled the CUDA kernels (nvcc found: SHARDTRAIN_HAVE_CUDA_KERNELS).
bool adamw_cuda_built();

// One AdamW step over n elements in device memory, queued on `cuda_stream` (a cudaStream_t;
// nullptr = the legacy default stream). bounds: device array of the decayed ranges as sorted
// [b0, e0, b1, e1, ...] (decay_bounds), n_bounds of them (0: nothing decays). Asynchronous;
// throws shardtrain::Error if the launch fails, or when the kernels were not built.
void adamw_step_cuda(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                     const int64_t* bounds, int64_t n_bounds, const AdamWScalars& s, void* cuda_stream);

}  // namespace shardtrain::optim
