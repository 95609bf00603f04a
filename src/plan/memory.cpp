// The planner's memory model: persistent state, unsharded buffers and activations at each instant of
// a step, from the engine's layout and the model's own activation costs; see docs/memory-planner.md
// for the formulas and the measurements that check them.
#include "shardtrain/plan/memory.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "shardtrain/fsdp/engine.h"
#include "shardtrain/runtime/device_mesh.h"

namespace shardtrain::plan {
namespace {
int64_t dtype_bytes(at::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }
}  // namespace

model::CostQuery cost_query(const fsdp::MixedPrecision& mp, int64_t micro_batch, int threads) {
  model::CostQuery q;
  q.micro_batch = micro_batch;
  q.compute_dtype = mp.param_dtype;
  q.keep_fp32 = mp.keep_fp32;
  q.threads = threads;
  return q;
}

ActivationBytes activation_bytes(const model::ModelSpec& spec, const fsdp::MixedPrecision& mp, int64_t micro_batch,
                                 int threads) {
  return model::build_model(spec, at::kMeta)->activation_bytes(cost_query(mp, micro_batch, threads));
}

namespace {
// One instant of the step: what it holds besides the persistent state.
struct Instant {
  const char* name;
  int64_t unsharded, grad_buffers, activations;
  bool with_optim = true;
};

}  // namespace

MemoryBreakdown peak_memory(const PlanSettings& ps, fsdp::Strategy st, const std::vector<fsdp::UnitPlan>& units, int S,
                            const ActivationBytes& a, bool rc) {
  const int64_t c = dtype_bytes(ps.engine.mp.reduce_dtype);
  const bool off = ps.engine.cpu_offload;
  MemoryBreakdown m;
  m.state_on_host = off;
  int64_t Ur = 0, Ub = 0, pend_b = 0, nb = 0, max_shard = 0;
  for (const auto& u : units) {
    int64_t U = 0, pend = 0;
    for (const auto& f : u.flats) {
      m.params += 4 * f.shard_numel;
      m.grads += 4 * f.shard_numel;
      max_shard = std::max(max_shard, f.shard_numel);
      if (f.aliases_master) continue;
      U += f.full_bytes();
      if (f.shard_size > 1) pend += f.padded * c + f.shard_numel * c;
    }
    if (u.is_root()) {
      Ur = U;
    } else if (!u.is_ignored()) {
      ++nb;
      Ub = std::max(Ub, U);
      pend_b = std::max(pend_b, pend);
    }
  }
  int64_t shard_elems = m.params / 4;
  if (ps.optimizer == "adamw") m.optim = 8 * shard_elems;
  else if (ps.sgd_momentum != 0) m.optim = 4 * shard_elems;
  // DiLoCo: the outer copy of the shards and the outer momentum (fp32; the engine keeps the
  // momentum buffer whatever diloco.outer_momentum), sharded like the optimizer state and held
  // like it from the first step on (not at init).
  if (runs_diloco(ps, st, S)) m.outer = 8 * shard_elems;
  // With cpu_offload the shards and optimizer state are host memory: the peak counts the
  // device (initialisation and clipping run on the host too).
  const int64_t state = off ? 0 : m.params + m.grads + m.optim + m.outer;

  const bool reshard_fwd = fsdp::reshards_after_forward(st);
  const bool no_shard = st == fsdp::Strategy::NoShard;
  const int64_t Gr = Ur, Gb = Ub;
  const int64_t U_fwd_end = Ur + (reshard_fwd ? 0 : nb * Ub);
  const int64_t prefetch = ps.engine.backward_prefetch == fsdp::BackwardPrefetch::Pre && nb >= 2 ? 1 : 0;
  const int64_t U_blk = reshard_fwd ? Ur + Ub * (1 + prefetch) : Ur + nb * Ub;
  // The next-to-last block prefetches its own successor only if a block precedes it.
  const int64_t U_blk2 = reshard_fwd ? Ur + Ub * (1 + (prefetch && nb >= 3 ? 1 : 0)) : Ur + std::max<int64_t>(0, nb - 1) * Ub;
  const int64_t U_blk3 = reshard_fwd ? Ur + Ub * (1 + (prefetch && nb >= 4 ? 1 : 0)) : Ur + std::max<int64_t>(0, nb - 2) * Ub;
  const int64_t U_end = no_shard ? Ur + nb * Ub : Ur;
  // fsdp.secondary_shards (hpZ, full_shard): each block keeps 1/node of its unsharded bytes from
  // its forward until its backward gathers it (the block in backward and the one prefetched have
  // taken theirs).
  const int Gn = runtime::mesh_shard_size(ps.shard_group_size, ps.ranks_per_host);
  const int64_t sec = ps.engine.compression.secondary_shards && fsdp::compression_support(st).secondary_shards && Gn > 0 ? Ub / Gn : 0;
  auto secs = [&](int64_t taken) { return std::max<int64_t>(0, nb - taken) * sec; };
  // A finished block's reduce-scatter input and output stay until it is retired, and the
  // engine retires by count only: fsdp::kMaxPendingReductions (2) are kept, whether or not
  // they have completed, so two are held once two blocks have finished, in every run.
  static_assert(fsdp::kMaxPendingReductions == 2, "the instants below follow two pending reductions");
  constexpr int64_t kMaxPending = static_cast<int64_t>(fsdp::kMaxPendingReductions);
  const int64_t pending = !no_shard && S > 1 ? pend_b : 0;
  const int64_t pending_end = std::min<int64_t>(nb, kMaxPending) * pending;
  const int64_t L = a.blocks;
  const int64_t bwd_work = std::max(a.block_bwd_mlp, a.block_bwd_attn);

  std::vector<Instant> at;
  if (!rc) {
    const int64_t saved_all = a.inputs + a.embed_saved + L * a.block_saved + a.head_saved;
    const int64_t B0 = a.inputs + a.embed_saved + L * a.block_saved - a.block_out_saved + a.grad_in + a.held_grad;
    at.push_back({"loss", U_fwd_end + secs(0), 0, saved_all + a.head_fwd_work});
    at.push_back({"loss backward", U_fwd_end + secs(0), 0, saved_all + a.head_bwd_work});
    at.push_back({"head backward", U_fwd_end + secs(0), Gr, saved_all + a.head_bwd_mm});
    at.push_back({"last block backward", U_blk + secs(1 + prefetch), Gr + Gb, B0 + bwd_work});
    if (L >= 2) at.push_back({"next-to-last block backward", U_blk2 + secs(2 + prefetch), Gr + Gb + pending, B0 - a.block_saved + bwd_work});
    if (L >= 3) at.push_back({"third-to-last block backward", U_blk3 + secs(3 + prefetch), Gr + Gb + kMaxPending * pending, B0 - 2 * a.block_saved + bwd_work});
  } else {
    const int64_t kept = a.inputs + a.embed_saved_rc + L * a.block_io + a.last_out_kept;
    const int64_t B0 = a.inputs + a.embed_saved_rc + L * a.block_io + a.grad_in + a.held_grad + a.block_saved +
                       (a.block_out_saved == 0 ? a.block_io : 0);
    at.push_back({"loss", U_fwd_end + secs(0), 0, kept + a.head_saved + a.head_fwd_work});
    at.push_back({"loss backward", U_fwd_end + secs(0), 0, kept + a.head_saved + a.head_bwd_work});
    at.push_back({"head backward", U_fwd_end + secs(0), Gr, kept + a.head_saved + a.head_bwd_mm});
    at.push_back({"last block backward", U_blk + secs(1 + prefetch), Gr + Gb, B0 + bwd_work});
    // The next block recomputes the same activations while the previous block's reduction is
    // still pending (its inputs stay with the recomputation nodes).
    if (L >= 2) at.push_back({"next-to-last block backward", U_blk2 + secs(2 + prefetch), Gr + Gb + pending, B0 + bwd_work});
    if (L >= 3) at.push_back({"third-to-last block backward", U_blk3 + secs(3 + prefetch), Gr + Gb + kMaxPending * pending, B0 + bwd_work});
  }
  // Recomputation nodes keep their block's input until the graph is freed after backward.
  at.push_back({"embedding backward", U_end, Gr + pending_end,
                a.inputs + a.embed_bwd + (rc ? L * a.block_io + a.embed_saved_rc : 0)});
  // clip_grad_norm: one chunk squared in fp64 (fsdp::kNormChunkElems), on the host too.
  if (!off) at.push_back({"clip", U_end, 0, 8 * std::min<int64_t>(max_shard, fsdp::kNormChunkElems)});

  // Sharded initialisation (fsdp::Engine, materialize): one flat at a time, the whole flat
  // in fp32, one parameter's init values, then this rank's master slice and the empty
  // compute-dtype buffer, over the masters and gradient shards of the flats before it.
  int64_t prior = 0, init_peak = 0;
  for (const auto& u : units) {
    for (const auto& f : u.flats) {
      int64_t max_param = 0;
      for (const auto& pr : f.params) max_param = std::max(max_param, pr.numel);
      const int64_t extra = f.aliases_master ? 4 * max_param : std::max(4 * max_param, 4 * f.shard_numel + f.full_bytes());
      init_peak = std::max(init_peak, prior + 4 * f.padded + extra);
      prior += 8 * f.shard_numel;
    }
  }
  if (!off) at.push_back({"init", 0, 0, init_peak - m.params - m.grads, false});

  int64_t best = -1;
  for (const auto& i : at) {
    const int64_t total = (i.with_optim ? state : m.params + m.grads) + i.unsharded + i.grad_buffers + i.activations;
    if (total > best) {
      best = total;
      m.unsharded = i.unsharded;
      m.grad_buffers = i.grad_buffers;
      m.activations = i.activations;
      m.peak_at = i.name;
    }
  }
  m.total = best;
  m.saved_activations = a.saved(rc);
  return m;
}

}  // namespace shardtrain::plan
