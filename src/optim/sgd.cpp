// Fused SGD kernels (plain, momentum first step, momentum, Nesterov) and the FusedSGD owner.
#include "shardtrain/optim/sgd.h"

#include "flat_loop.h"

namespace shardtrain::optim {
namespace {

enum class Momentum { None, First, Running };

struct SGDArgs {
  float* param;
  const float* grad;
  float* buf;
  float weight_decay, momentum, neg_lr;
};

// Every choice is a template parameter, so each segment runs a branch-free loop body.
template <bool kDecay, Momentum kMomentum, bool kNesterov>
struct SGDKernel {
  SGDArgs a;

  KOKKOS_INLINE_FUNCTION void operator()(const long i) const {
    const float p = a.param[i];
    float d = a.grad[i];
    if constexpr (kDecay) d = d + a.weight_decay * p;  // torch: d_p = d_p.add(p, wd)
    if constexpr (kMomentum != Momentum::None) {
      float b;
      if constexpr (kMomentum == Momentum::First) b = d;  // torch clones d_p on the first step
      else b = a.buf[i] * a.momentum + d;                  // buf.mul_(momentum).add_(d_p)
      a.buf[i] = b;
      if constexpr (kNesterov) d = d + a.momentum * b;     // d_p.add(buf, momentum)
      else d = b;
    }
    a.param[i] = p + a.neg_lr * d;  // p.add_(d_p, -lr)
  }
};

template <bool kDecay>
void run_segment(const SGDArgs& a, bool nesterov, int64_t step, int64_t b, int64_t e) {
  auto run = [&](auto kernel) { Kokkos::parallel_for("sgd", detail::flat_policy(b, e), kernel); };
  if (a.momentum == 0.0f) run(SGDKernel<kDecay, Momentum::None, false>{a});
  else if (step == 1 && nesterov) run(SGDKernel<kDecay, Momentum::First, true>{a});
  else if (step == 1) run(SGDKernel<kDecay, Momentum::First, false>{a});
  else if (nesterov) run(SGDKernel<kDecay, Momentum::Running, true>{a});
  else run(SGDKernel<kDecay, Momentum::Running, false>{a});
}

}  // namespace

void SGDConfig::validate() const {
  ST_USER_CHECK(momentum >= 0.0f, "sgd momentum must be >= 0, got ", momentum);
  ST_USER_CHECK(weight_decay >= 0.0f, "sgd weight_decay must be >= 0, got ", weight_decay);
  ST_USER_CHECK(!nesterov || momentum > 0.0f, "sgd nesterov needs momentum > 0");
}

void sgd_step(float* param, const float* grad, float* momentum_buffer, int64_t n,
              const DecayMask& decay, const SGDConfig& cfg, float lr, int64_t step) {
  detail::require_kokkos("sgd_step");
  ST_CHECK(step >= 1, "sgd step numbers start at 1, got ", step);
  ST_CHECK(n >= 0, "negative shard length ", n);
  if (n == 0) return;
  ST_CHECK(param && grad, "sgd_step given a null array");
  ST_CHECK(cfg.momentum == 0.0f || momentum_buffer, "sgd with momentum needs a momentum buffer");

  const SGDArgs args{param, grad, momentum_buffer, cfg.weight_decay, cfg.momentum, -lr};
  const bool decays = cfg.weight_decay != 0.0f;
  detail::for_each_segment(decay, n, [&](int64_t b, int64_t e, bool decayed) {
    if (decayed && decays) run_segment<true>(args, cfg.nesterov, step, b, e);
    else run_segment<false>(args, cfg.nesterov, step, b, e);
  });
}

FusedSGD::FusedSGD(int64_t n, SGDConfig cfg) : cfg_(cfg), n_(n) {
  cfg_.validate();
  ST_CHECK(n >= 0, "negative shard length ", n);
  if (cfg_.momentum != 0.0f) momentum_.assign(static_cast<size_t>(n), 0.0f);
}

void FusedSGD::step(float* param, const float* grad, int64_t n, const DecayMask& decay, float lr) {
  ST_CHECK(n == n_, "FusedSGD holds state for ", n_, " elements, step given ", n);
  sgd_step(param, grad, momentum_buffer(), n, decay, cfg_, lr, steps_taken_ + 1);
  ++steps_taken_;
}

void FusedSGD::set_steps_taken(int64_t steps) {
  ST_CHECK(steps >= 0, "negative step count ", steps);
  steps_taken_ = steps;
}

}  // namespace shardtrain::optim
