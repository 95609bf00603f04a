// The AdamW update of one element, shared by every implementation: the Kokkos kernel
// (adamw.cpp), the CUDA kernel (adamw_cuda.cu) and the host loop that mirrors the CUDA kernel
// (adamw_step_host_loop). One function, so the three cannot drift apart; the CUDA file is
// compiled with --fmad=false and IEEE sqrt/division (nvcc's defaults), so the device computes
// exactly the host's operations in the same order and matches it bit for bit.
// No libtorch, no Kokkos, no CUDA headers: usable from .cpp and .cu alike.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define ST_HOST_DEVICE __host__ __device__
#else
#define ST_HOST_DEVICE
#endif

namespace shardtrain::optim {

// Per-step scalars, computed in double and rounded to float once per step (adamw_scalars).
// torch computes p - lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps): two divisions per element.
// Multiplying numerator and denominator by sqrt(bc2) leaves one,
//   p - (lr*sqrt(bc2)/bc1) * m / (sqrt(v) + eps*sqrt(bc2)),
// equal up to one rounding.
struct AdamWScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float decay_factor;   // 1 - lr*wd
  float eps_scaled;     // eps * sqrt(1 - beta2^step)
  float neg_step_size;  // -lr * sqrt(1 - beta2^step) / (1 - beta1^step)
};

// One element. kDecay: the element takes weight decay (a template parameter, so that loops over
// no-decay segments carry no multiply and no branch).
template <bool kDecay>
ST_HOST_DEVICE inline void adamw_update(float& param, float grad, float& exp_avg, float& exp_avg_sq,
                                        const AdamWScalars& s) {
  float p = param;
  if (kDecay) p = p * s.decay_factor;
  // The moments in torch's operation order: mul_(beta1).add_(g, 1-beta1), addcmul_(g, g, 1-beta2).
  const float m = exp_avg * s.beta1 + s.one_minus_beta1 * grad;
  const float v = exp_avg_sq * s.beta2 + s.one_minus_beta2 * grad * grad;
  const float denom = std::sqrt(v) + s.eps_scaled;
  exp_avg = m;
  exp_avg_sq = v;
  param = p + s.neg_step_size * m / denom;
}

// Whether element i decays, given the decayed ranges flattened as sorted bounds
// [b0, e0, b1, e1, ...] (a DecayMask's ranges): i is inside a range when the number of bounds
// <= i is odd. Binary search, so the device kernel needs no per-segment launches.
ST_HOST_DEVICE inline bool in_decayed_range(const int64_t* bounds, int64_t n_bounds, int64_t i) {
  int64_t lo = 0, hi = n_bounds;  // count of bounds <= i: first index with bounds[k] > i
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (bounds[mid] <= i) lo = mid + 1;
    else hi = mid;
  }
  return (lo & 1) != 0;
}

}  // namespace shardtrain::optim
