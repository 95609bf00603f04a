// Fused AdamW kernel (one Kokkos loop per DecayMask segment) and the FusedAdamW state owner.
#include "shardtrain/optim/adamw.h"

#include <cmath>

#include "flat_loop.h"

namespace shardtrain::optim {
namespace {

// kDecay is a template parameter so that the no-decay segments carry no multiply at all and
// the loop body has no branch. The update itself is adamw_update (adamw_math.h), shared with
// the CUDA kernel.
template <bool kDecay>
struct AdamWKernel {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  AdamWScalars s;

  KOKKOS_INLINE_FUNCTION void operator()(const long i) const {
    adamw_update<kDecay>(param[i], grad[i], exp_avg[i], exp_avg_sq[i], s);
  }
};

}  // namespace

AdamWScalars adamw_scalars(const AdamWConfig& cfg, float lr, int64_t step) {
  const double beta1 = cfg.beta1, beta2 = cfg.beta2;
  const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  AdamWScalars s;
  s.beta1 = cfg.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = cfg.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.decay_factor = static_cast<float>(1.0 - static_cast<double>(lr) * cfg.weight_decay);
  s.eps_scaled = static_cast<float>(static_cast<double>(cfg.eps) * std::sqrt(bias2));
  s.neg_step_size = static_cast<float>(-static_cast<double>(lr) * std::sqrt(bias2) / bias1);
  return s;
}

std::vector<int64_t> decay_bounds(const DecayMask& decay, const AdamWConfig& cfg) {
  std::vector<int64_t> b;
  if (cfg.weight_decay == 0.0f) return b;  // nothing decays
  for (const ElementRange& r : decay.ranges()) {
    b.push_back(r.begin);
    b.push_back(r.end);
  }
  return b;
}

void adamw_step_host_loop(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                          const int64_t* bounds, int64_t n_bounds, const AdamWScalars& s) {
  // The CUDA kernel's body, one element at a time (see adamw_cuda.cu).
  for (int64_t i = 0; i < n; ++i) {
    if (in_decayed_range(bounds, n_bounds, i))
      adamw_update<true>(param[i], grad[i], exp_avg[i], exp_avg_sq[i], s);
    else
      adamw_update<false>(param[i], grad[i], exp_avg[i], exp_avg_sq[i], s);
  }
}

void AdamWConfig::validate() const {
  ST_USER_CHECK(beta1 >= 0.0f && beta1 < 1.0f, "adamw beta1 must be in [0, 1), got ", beta1);
  ST_USER_CHECK(beta2 >= 0.0f && beta2 < 1.0f, "adamw beta2 must be in [0, 1), got ", beta2);
  ST_USER_CHECK(eps >= 0.0f, "adamw eps must be >= 0, got ", eps);
  ST_USER_CHECK(weight_decay >= 0.0f, "adamw weight_decay must be >= 0, got ", weight_decay);
}

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const DecayMask& decay, const AdamWConfig& cfg, float lr, int64_t step) {
  detail::require_kokkos("adamw_step");
  ST_CHECK(step >= 1, "adamw step numbers start at 1, got ", step);
  ST_CHECK(n >= 0, "negative shard length ", n);
  if (n == 0) return;
  ST_CHECK(param && grad && exp_avg && exp_avg_sq, "adamw_step given a null array");

  const AdamWScalars s = adamw_scalars(cfg, lr, step);
  const bool decays = cfg.weight_decay != 0.0f;
  detail::for_each_segment(decay, n, [&](int64_t b, int64_t e, bool decayed) {
    if (decayed && decays)
      Kokkos::parallel_for("adamw_decay", detail::flat_policy(b, e),
                           AdamWKernel<true>{param, grad, exp_avg, exp_avg_sq, s});
    else
      Kokkos::parallel_for("adamw", detail::flat_policy(b, e),
                           AdamWKernel<false>{param, grad, exp_avg, exp_avg_sq, s});
  });
}

FusedAdamW::FusedAdamW(int64_t n, AdamWConfig cfg)
    : cfg_(cfg), exp_avg_(static_cast<size_t>(n), 0.0f), exp_avg_sq_(static_cast<size_t>(n), 0.0f) {
  cfg_.validate();
}

void FusedAdamW::step(float* param, const float* grad, int64_t n, const DecayMask& decay,
                      float lr) {
  ST_CHECK(n == size(), "FusedAdamW holds state for ", size(), " elements, step given ", n);
  adamw_step(param, grad, exp_avg_.data(), exp_avg_sq_.data(), n, decay, cfg_, lr,
             steps_taken_ + 1);
  ++steps_taken_;
}

void FusedAdamW::set_steps_taken(int64_t steps) {
  ST_CHECK(steps >= 0, "negative step count ", steps);
  steps_taken_ = steps;
}

}  // namespace shardtrain::optim
