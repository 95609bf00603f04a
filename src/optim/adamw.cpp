// Fused AdamW kernel (one Kokkos loop per DecayMask segment) and the FusedAdamW state owner.
#include "shardtrain/optim/adamw.h"

#include <cmath>

#include "flat_loop.h"

namespace shardtrain::optim {
namespace {

// Per-step scalars, computed in double and rounded to float once per step.
// torch computes p - lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps): two divisions per element.
// Multiplying numerator and denominator by sqrt(bc2) leaves one,
//   p - (lr*sqrt(bc2)/bc1) * m / (sqrt(v) + eps*sqrt(bc2)),
// equal up to one rounding; it matters because with SSE the divisions, not memory, bound the
// kernel while the shard is in cache (measured 1.4x at 1M elements, see perf/README.md).
struct AdamWScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float decay_factor;   // 1 - lr*wd
  float eps_scaled;     // eps * sqrt(1 - beta2^step)
  float neg_step_size;  // -lr * sqrt(1 - beta2^step) / (1 - beta1^step)
};

// kDecay is a template parameter so that the no-decay segments carry no multiply at all and
// the loop body has no branch.
template <bool kDecay>
struct AdamWKernel {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  AdamWScalars s;

  KOKKOS_INLINE_FUNCTION void operator()(const long i) const {
    const float g = grad[i];
    float p = param[i];
    if constexpr (kDecay) p = p * s.decay_factor;
    // The moments in torch's operation order: mul_(beta1).add_(g, 1-beta1), addcmul_(g, g, 1-beta2).
    const float m = exp_avg[i] * s.beta1 + s.one_minus_beta1 * g;
    const float v = exp_avg_sq[i] * s.beta2 + s.one_minus_beta2 * g * g;
    const float denom = std::sqrt(v) + s.eps_scaled;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p + s.neg_step_size * m / denom;
  }
};

}  // namespace

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
