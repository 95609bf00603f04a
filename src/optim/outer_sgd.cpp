// The fused outer SGD kernel of DiLoCo (outer_sgd.h).
#include "shardtrain/optim/outer_sgd.h"

#include "flat_loop.h"

namespace shardtrain::optim {
namespace {

struct OuterArgs {
  float* outer;
  float* buf;
  const float* g;
  float* local;
  float momentum, neg_lr;
};

// Nesterov and whether a local copy is written are template parameters: branch-free bodies.
template <bool kNesterov, bool kLocal>
struct OuterKernel {
  OuterArgs a;
  KOKKOS_INLINE_FUNCTION void operator()(const long i) const {
    const float g = a.g[i];
    const float m = a.momentum * a.buf[i] + g;
    a.buf[i] = m;
    const float u = kNesterov ? g + a.momentum * m : m;
    const float o = a.outer[i] + a.neg_lr * u;
    a.outer[i] = o;
    if constexpr (kLocal) a.local[i] = o;
  }
};

}  // namespace

void outer_sgd_step(float* outer, float* momentum_buffer, const float* g, float* local, int64_t n,
                    const OuterSGDConfig& cfg) {
  detail::require_kokkos("outer_sgd_step");
  ST_CHECK(n >= 0, "negative shard length ", n);
  if (n == 0) return;
  ST_CHECK(outer && momentum_buffer && g, "outer_sgd_step given a null array");
  const OuterArgs a{outer, momentum_buffer, g, local, cfg.momentum, -cfg.lr};
  auto run = [&](auto kernel) { Kokkos::parallel_for("outer_sgd", detail::flat_policy(0, n), kernel); };
  if (cfg.nesterov && local) run(OuterKernel<true, true>{a});
  else if (cfg.nesterov) run(OuterKernel<true, false>{a});
  else if (local) run(OuterKernel<false, true>{a});
  else run(OuterKernel<false, false>{a});
  Kokkos::fence();
}

}  // namespace shardtrain::optim
