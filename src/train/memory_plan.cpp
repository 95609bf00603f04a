// Memory planner: persistent state, unsharded buffers, activations and communication per strategy,
// from the engine's layout (fsdp::plan_units on a meta model) and the model's own activation costs
// (model::Model::activation_bytes); see docs/memory-planner.md for the formulas and the
// measurements that check them.
#include "shardtrain/train/memory_plan.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/quantize.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"

namespace shardtrain::train {
namespace {

int64_t dtype_bytes(at::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

model::CostQuery cost_query(const fsdp::MixedPrecision& mp, int64_t micro_batch, int threads) {
  model::CostQuery q;
  q.micro_batch = micro_batch;
  q.compute_dtype = mp.param_dtype;
  q.keep_fp32 = mp.keep_fp32;
  q.threads = threads;
  return q;
}

}  // namespace

ActivationBytes activation_bytes(const model::ModelSpec& spec, const fsdp::MixedPrecision& mp, int64_t micro_batch,
                                 int threads) {
  return model::build_model(spec, at::kMeta)->activation_bytes(cost_query(mp, micro_batch, threads));
}

// ---- per strategy: state, unsharded buffers, the peak, communication --------------------------

const std::vector<fsdp::Strategy>& all_strategies() {
  static const std::vector<fsdp::Strategy> all = {fsdp::Strategy::FullShard, fsdp::Strategy::ShardGradOp,
                                                  fsdp::Strategy::NoShard, fsdp::Strategy::HybridShard,
                                                  fsdp::Strategy::HybridShardZero2};
  return all;
}

namespace {

int group_size_for(const PlanSettings& ps, fsdp::Strategy st) {
  if (st == fsdp::Strategy::NoShard) return 1;
  if (fsdp::is_hybrid(st)) return ps.shard_group_size > 0 ? ps.shard_group_size : ps.ranks_per_host;
  return ps.ranks;
}

// Whether the ranks of one group lie on more than one host (hosts: consecutive blocks of
// ranks_per_host ranks; groups as runtime::DeviceMesh builds them).
bool spans_hosts(const std::vector<int>& members, int ranks_per_host) {
  for (int m : members)
    if (m / ranks_per_host != members.front() / ranks_per_host) return true;
  return false;
}

// Ring edges that leave the busiest host when every group of a family runs its ring at once,
// in group-rank order (family "shard": the groups [kS, (k+1)S); "replicate": {j, j+S, j+2S, ...}).
// A rank sends its ring bytes along its edge to the next member; an edge to another host
// crosses the sender's link, so a host's link carries (edges leaving it) x (bytes per rank).
// full_shard over 2 hosts of 2: 1 edge (1 -> 2); hybrid_shard's replicate groups {0,2}, {1,3}:
// 2 edges (0 -> 2 and 1 -> 3 share host 0's link).
int ring_edges_leaving_busiest_host(int N, int G, int S, bool shard_family) {
  std::vector<int> leaving(static_cast<size_t>(N / G), 0);
  const int groups = shard_family ? N / S : S, members = shard_family ? S : N / S;
  auto rank_of = [&](int g, int i) { return shard_family ? g * S + i : g + i * S; };
  for (int g = 0; g < groups && members > 1; ++g)
    for (int i = 0; i < members; ++i) {
      const int from = rank_of(g, i) / G, to = rank_of(g, (i + 1) % members) / G;
      if (from != to) ++leaving[from];
    }
  return *std::max_element(leaving.begin(), leaving.end());
}

struct Instant {
  const char* name;
  int64_t unsharded, grad_buffers, activations;
  bool with_optim = true;
};

}  // namespace

namespace detail {
// The peak of one step for one strategy and recomputation setting.
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
  // With cpu_offload the shards and optimizer state are host memory: the peak counts the
  // device (initialisation and clipping run on the host too).
  const int64_t state = off ? 0 : m.params + m.grads + m.optim;

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
  const int Gn = ps.shard_group_size > 0 ? ps.shard_group_size : ps.ranks_per_host;
  const int64_t sec = ps.engine.compression.secondary_shards && st == fsdp::Strategy::FullShard && Gn > 0 ? Ub / Gn : 0;
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
}  // namespace detail

double link_weight(const PlanSettings& ps, int edges) {
  if (edges <= 0) return 1.0;
  if (edges == 1) return ps.inter_host_weight;
  const size_t i = static_cast<size_t>(edges - 2);
  return i < ps.shared_link_weights.size() ? ps.shared_link_weights[i] : ps.inter_host_weight * edges;
}

// Communication per rank per step of plan p (its units and groups already set), with the
// quantized weight gather (qw) and / or the quantized replica average (qg): ring algorithms, an
// all-gather or reduce-scatter over S ranks sends (S-1)/S of the buffer, an all-reduce over R
// ranks 2(R-1)/R; quantized, a gather sends (S-1) packed shards (int8 + an fp32 scale per
// fsdp.quant_block values) and the replica average is an all-gather of R-1 packed shards. The
// accuracy guard adds the exact collective every quant_guard_every steps (amortised here).
namespace {
struct CommCost {
  CommVolume volume;
  double cost = 0;
  std::vector<PlannedCollective> collectives;  // what volume sums, one by one (step_time.h)
};
CommCost comm_volume(const PlanSettings& ps, fsdp::Strategy st, const StrategyPlan& p, bool qw, bool qg, bool hp) {
  CommCost out;
  const int N = ps.ranks, G = ps.ranks_per_host, S = p.shard_size;
  // hpZ: full_shard's backward gathers run over the node group (parallel.shard_group_size or the
  // host), inside the host, in full param_dtype from the secondary shards.
  const int Gn = ps.shard_group_size > 0 ? ps.shard_group_size : G;
  double ag_node = 0;
  const int64_t block = ps.engine.compression.block;
  const double guard = ps.engine.compression.guard_every > 0 ? 1.0 / ps.engine.compression.guard_every : 0.0;
  const int64_t b_reduce = dtype_bytes(ps.engine.mp.reduce_dtype);
  double ag = 0, rs = 0, ar_rep = 0, ar_world = 0;
  const double ring = S > 1 ? static_cast<double>(S - 1) / S : 0.0;
  const int R = p.replicate_size;
  // Ring edges that leave the busiest host, per family (below), and the time weight of its bytes.
  const int es = ring_edges_leaving_busiest_host(N, G, S, true);
  const int er = ring_edges_leaving_busiest_host(N, G, S, false);
  const int ew = ring_edges_leaving_busiest_host(N, G, 1, false);
  auto weight = [&](int edges) { return std::max(1.0, link_weight(ps, edges)); };
  auto emit = [&](CollectiveKind k, int unit, double bytes, int steps, int edges) {
    if (bytes <= 0) return;
    PlannedCollective c;
    c.kind = k;
    c.unit = unit;
    c.bytes = bytes;
    c.ring_steps = steps;
    c.weight = weight(edges);
    c.crosses_link = edges > 0;
    out.collectives.push_back(c);
  };
  for (size_t ui = 0; ui < p.units.size(); ++ui) {
    const auto& u = p.units[ui];
    const int unit = static_cast<int>(ui);
    for (const auto& f : u.flats) {
      if (u.is_ignored()) {
        if (N > 1) ar_world += 4.0 * f.numel * 2.0 * (N - 1) / N;
        continue;
      }
      const int gathers = u.is_root() ? 1 : (fsdp::reshards_after_forward(st) ? 2 : 1);
      if (st != fsdp::Strategy::NoShard) {
        const double plain = ring * f.padded * f.elem_bytes();
        const double packed = S > 1 ? (S - 1.0) * fsdp::quantized_bytes(f.shard_numel, block) : 0.0;
        const double one = qw ? packed + guard * plain : plain;
        emit(CollectiveKind::ForwardGather, unit, one, S - 1, es);
        if (hp && gathers == 2) {
          ag += ps.grad_accum * one;
          const double node = (Gn - 1.0) / Gn * f.padded * f.elem_bytes();
          ag_node += ps.grad_accum * node;
          emit(CollectiveKind::BackwardGather, unit, node, Gn - 1, 0);
        } else {
          ag += ps.grad_accum * gathers * one;
          if (gathers == 2) emit(CollectiveKind::BackwardGather, unit, one, S - 1, es);
        }
        const double scatter = ring * f.padded * b_reduce;
        rs += ps.grad_accum * scatter;
        emit(CollectiveKind::ReduceScatter, unit, scatter, S - 1, es);
      }
      if (R > 1) {
        const double plain = 4.0 * f.shard_numel * 2.0 * (R - 1) / R;
        ar_rep += qg ? (R - 1.0) * fsdp::quantized_bytes(f.shard_numel, block) + guard * plain : plain;
      }
    }
  }
  // The step's all-reduces, one coalesced call per group (ar_rep, ar_world are per step): qgZ's
  // replica average is an all-gather of packed shards (R - 1 steps), else a ring all-reduce.
  emit(CollectiveKind::ReplicaAllReduce, -1, ar_rep, qg ? R - 1 : 2 * (R - 1), er);
  emit(CollectiveKind::ReplicaAllReduce, -1, ar_world, 2 * (N - 1), ew);
  out.volume.all_gather = static_cast<int64_t>(ag + ag_node);
  out.volume.reduce_scatter = static_cast<int64_t>(rs);
  out.volume.all_reduce = static_cast<int64_t>(ar_rep + ar_world);
  const int64_t shard_part = static_cast<int64_t>(ag) + out.volume.reduce_scatter;
  (p.shard_spans_hosts ? out.volume.inter_host : out.volume.intra_host) += shard_part;
  out.volume.intra_host += static_cast<int64_t>(ag_node);
  (p.replicate_spans_hosts || (st == fsdp::Strategy::NoShard && N > G) ? out.volume.inter_host : out.volume.intra_host) +=
      out.volume.all_reduce;
  // What crosses the busiest host's link, and the cost of each family of rings: bytes per rank
  // times max(1, link_weight(edges that share the link)): a ring runs at its slowest edge, and
  // the rings of one family run at the same time (hybrid_shard's replicate groups all cross one
  // link, and the flows that share it get what the measured weight says, not a fair split).
  // Ignored units' all-reduces run over the world (a replicate family of shard size 1).
  out.volume.inter_host_link = static_cast<int64_t>(es * (ag + rs) + er * ar_rep + ew * ar_world);
  auto cost = [&](double bytes, int edges) { return bytes * weight(edges); };
  out.cost = cost(ag + rs, es) + cost(ar_rep, er) + cost(ar_world, ew) + ag_node;
  return out;
}
}  // namespace

namespace {
// step_flops on the model and units plan_strategy already has.
double step_flops(const PlanSettings& ps, const model::Model& m, const std::vector<fsdp::UnitPlan>& units,
                  bool recompute) {
  // The trainer's MFU numerator per item (a token of a language model, an image of a ViT), times
  // the items one rank trains on in a step.
  const double items = static_cast<double>(ps.micro_batch * ps.grad_accum) *
                       (model::input_kind(ps.spec) == model::InputKind::Tokens ? static_cast<double>(ps.spec.seq_len) : 1.0);
  const double flops = m.train_flops_per_item() * items;
  // Recomputation runs each block's forward again (a unit's parameters do not depend on S).
  return recompute ? flops * recompute_flops_factor(units) : flops;
}
}  // namespace

double step_flops(const PlanSettings& ps, bool recompute) {
  const std::shared_ptr<model::Model> meta = model::build_model(ps.spec, at::kMeta);
  return step_flops(ps, *meta, fsdp::plan_units(*meta, ps.engine, 1), recompute);
}

StrategyPlan plan_strategy(const PlanSettings& ps, fsdp::Strategy st) {
  StrategyPlan p;
  p.strategy = st;
  const int N = ps.ranks, G = ps.ranks_per_host;
  ST_USER_CHECK(N >= 1, "--ranks must be >= 1 (got ", N, ")");
  ST_USER_CHECK(G >= 1 && N % G == 0, "--ranks-per-host ", G, " must divide --ranks ", N);
  const int S = group_size_for(ps, st);
  ST_USER_CHECK(S >= 1 && N % S == 0, fsdp::to_string(st), ": shard group size ", S, " (parallel.shard_group_size",
                " or --ranks-per-host) must divide --ranks ", N);
  p.shard_size = S;
  p.replicate_size = N / S;
  std::vector<int> shard0, rep0;
  for (int r = 0; r < S; ++r) shard0.push_back(r);
  for (int r = 0; r < p.replicate_size; ++r) rep0.push_back(r * S);
  p.shard_spans_hosts = S > 1 && spans_hosts(shard0, G);
  p.replicate_spans_hosts = p.replicate_size > 1 && spans_hosts(rep0, G);

  fsdp::EngineOptions eo = ps.engine;
  eo.strategy = st;
  const std::shared_ptr<model::Model> meta = model::build_model(ps.spec, at::kMeta);
  p.units = fsdp::plan_units(*meta, eo, S);
  const ActivationBytes a = meta->activation_bytes(cost_query(ps.engine.mp, ps.micro_batch, ps.threads));
  p.mem_no_recompute = detail::peak_memory(ps, st, p.units, S, a, false);
  p.mem_recompute = detail::peak_memory(ps, st, p.units, S, a, true);
  p.mem = ps.engine.activation_checkpointing ? p.mem_recompute : p.mem_no_recompute;

  // Communication per rank per step, with the deck's quantization options (fsdp.quantize_*)
  // where this strategy runs them, and each option alone for the report.
  const fsdp::Compression& c = ps.engine.compression;
  const bool qw_ok = st != fsdp::Strategy::NoShard, qg_ok = fsdp::is_hybrid(st), hp_ok = st == fsdp::Strategy::FullShard;
  CommCost deck =
      comm_volume(ps, st, p, c.quantize_weights && qw_ok, c.quantize_grads && qg_ok, c.secondary_shards && hp_ok);
  p.comm = deck.volume;
  p.comm_cost = deck.cost;
  p.collectives = std::move(deck.collectives);
  // The step time, from the same collectives (step_time.h), without and with recomputation.
  StepTimeInputs in;
  in.strategy = st;
  in.units = &p.units;
  in.collectives = &p.collectives;
  in.grad_accum = static_cast<int>(ps.grad_accum);
  in.ranks_per_host = G;
  in.threads = ps.threads;
  in.forward_prefetch = ps.engine.forward_prefetch;
  in.backward_prefetch = ps.engine.backward_prefetch;
  for (const auto& u : p.units)
    for (const auto& f : u.flats) in.params_per_rank += static_cast<double>(f.shard_numel);
  for (bool rc : {false, true}) {
    in.recompute = rc;
    in.step_flops = step_flops(ps, *meta, p.units, rc);
    (rc ? p.step_recompute : p.step_no_recompute) = estimate_step(ps.step, in);
  }
  p.step = ps.engine.activation_checkpointing ? p.step_recompute : p.step_no_recompute;
  auto inter = [&](bool qw, bool qg, bool hp) { return comm_volume(ps, st, p, qw, qg, hp).volume.inter_host; };
  p.inter_host_plain = inter(false, false, false);
  p.inter_host_qwz = qw_ok ? inter(true, false, false) : -1;
  p.inter_host_qgz = qg_ok ? inter(false, true, false) : -1;
  p.inter_host_hpz = hp_ok ? inter(false, false, true) : -1;
  p.inter_host_all = qw_ok ? inter(true, qg_ok, hp_ok) : -1;
  return p;
}

std::vector<StrategyPlan> plan_all(const PlanSettings& ps) {
  std::vector<StrategyPlan> out;
  for (fsdp::Strategy st : all_strategies()) {
    if (fsdp::is_hybrid(st)) {
      const int S = group_size_for(ps, st);
      if (S < 1 || ps.ranks % S != 0) continue;  // reported by the caller
    }
    out.push_back(plan_strategy(ps, st));
  }
  return out;
}

int recommend(const std::vector<StrategyPlan>& plans, int64_t device_bytes, bool* recompute) {
  int best = -1;
  bool best_rc = false;
  for (int pass = 0; pass < 2 && best < 0; ++pass) {  // without recomputation first
    auto mem = [&](const StrategyPlan& p) { return pass == 0 ? p.mem_no_recompute.total : p.mem_recompute.total; };
    auto step = [&](const StrategyPlan& p) { return pass == 0 ? p.step_no_recompute.step_s() : p.step_recompute.step_s(); };
    for (size_t i = 0; i < plans.size(); ++i) {
      if (mem(plans[i]) > device_bytes) continue;
      if (best < 0 || step(plans[i]) < step(plans[best]) ||
          (step(plans[i]) == step(plans[best]) && mem(plans[i]) < mem(plans[best]))) {
        best = static_cast<int>(i);
        best_rc = pass == 1;
      }
    }
  }
  if (recompute) *recompute = best_rc;
  return best;
}

// ---- text ----------------------------------------------------------------------------------

std::string format_bytes(int64_t bytes) {
  char buf[64];
  const double v = static_cast<double>(bytes);
  const double a = std::fabs(v);
  if (a >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", v / (1024.0 * 1024 * 1024));
  else if (a >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", v / (1024.0 * 1024));
  else if (a >= 1024.0) std::snprintf(buf, sizeof buf, "%.1f KiB", v / 1024.0);
  else std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  return buf;
}

int64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw UserError(what + ": '" + text + "' is not a size (examples: 80GiB, 512MiB, 2GB, 1.5e9)");
  }
  std::string unit = text.substr(pos);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb") mult = 1e3;
  else if (unit == "m" || unit == "mb") mult = 1e6;
  else if (unit == "g" || unit == "gb") mult = 1e9;
  else if (unit == "t" || unit == "tb") mult = 1e12;
  else if (unit == "kib") mult = 1024.0;
  else if (unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else throw UserError(what + ": unknown unit '" + text.substr(pos) + "' in '" + text + "' (B, KB, MB, GB, KiB, MiB, GiB)");
  ST_USER_CHECK(v > 0 && std::isfinite(v), what, ": '", text, "' must be a positive size");
  ST_USER_CHECK(v * mult < 9.0e18, what, ": '", text, "' is too large (at most 8 EiB)");
  return static_cast<int64_t>(v * mult);
}

PlanSettings plan_settings_from_deck(const deck::Deck& d, int ranks, int ranks_per_host) {
  PlanSettings ps;
  ps.spec = model_spec_from_deck(d);
  std::shared_ptr<model::Model> m = model::build_model(ps.spec, at::kMeta);
  ps.engine = engine_options_from_deck(d, *m);
  ps.optimizer = d.get_string("optimizer.name");
  ps.sgd_momentum = d.get_float("optimizer.momentum");
  ps.ranks = ranks;
  ps.ranks_per_host = ranks_per_host;
  ps.shard_group_size = static_cast<int>(d.get_int("parallel.shard_group_size"));
  ps.threads = threads_per_rank(d, ranks_per_host);
  const BatchPlan bp = plan_batches(d, ranks);
  ps.micro_batch = bp.micro_batch;
  ps.grad_accum = bp.grad_accum;
  return ps;
}

namespace {

char rank_symbol(int r) {
  static const char* sym = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  return r < 62 ? sym[r] : '#';
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return v < 0 ? "-" + out : out;
}

// One line per flat: the padded flat cut into shard slices, one symbol per shard rank.
std::string flat_bar(const fsdp::FlatPlan& f, int S, int width) {
  std::string bar(width, ' ');
  for (int i = 0; i < width; ++i) {
    const int64_t e = static_cast<int64_t>((static_cast<double>(i) + 0.5) * f.padded / width);
    bar[i] = e >= f.numel ? '.' : rank_symbol(static_cast<int>(std::min<int64_t>(S - 1, e / f.shard_numel)));
  }
  return "[" + bar + "]";
}

std::string unit_label(const fsdp::UnitPlan& u, const fsdp::FlatPlan& f) {
  return u.name + (u.flats.size() > 1 ? std::string(" (") + fsdp::dtype_name(f.dtype) + ")" : std::string());
}

}  // namespace

std::string sharding_diagram(const PlanSettings& ps, const StrategyPlan& p, int width) {
  std::ostringstream os;
  const int S = p.shard_size, R = p.replicate_size, G = ps.ranks_per_host;
  os << "sharding: " << fsdp::to_string(p.strategy) << " - ";
  if (S == 1) {
    os << "every rank holds every unit whole (" << R << " replica" << (R > 1 ? "s" : "") << ")\n";
  } else {
    os << R << " shard group" << (R > 1 ? "s" : "") << " of " << S << " ranks";
    for (int g = 0; g < R && g < 4; ++g) {
      os << (g == 0 ? ": " : ", ") << "{";
      for (int r = 0; r < S; ++r) os << (r ? "," : "") << g * S + r;
      os << "}";
    }
    if (R > 4) os << ", ...";
    os << "; digit = shard rank";
    if (R > 1) os << " (world rank = group x " << S << " + digit; the ranks with one digit form a replicate group and hold the same slice)";
    os << "; '.' = padding\n";
  }
  size_t name_w = 6;
  for (const auto& u : p.units)
    for (const auto& f : u.flats) name_w = std::max(name_w, unit_label(u, f).size());
  name_w = std::min<size_t>(name_w, 40);
  char head[256];
  std::snprintf(head, sizeof head, "  %-*s %14s %12s  %s\n", static_cast<int>(name_w), "unit", "elements",
                S > 1 ? "per rank" : "", S > 1 ? "layout over the flat parameter" : "");
  os << head;
  // Fold runs of units whose flats have the same sizes (the blocks) into one line.
  size_t i = 0;
  while (i < p.units.size()) {
    size_t j = i + 1;
    auto same = [&](const fsdp::UnitPlan& a, const fsdp::UnitPlan& b) {
      if (a.is_root() || b.is_root() || a.is_ignored() != b.is_ignored() || a.flats.size() != b.flats.size()) return false;
      for (size_t k = 0; k < a.flats.size(); ++k)
        if (a.flats[k].numel != b.flats[k].numel || a.flats[k].dtype != b.flats[k].dtype) return false;
      return true;
    };
    while (j < p.units.size() && same(p.units[i], p.units[j])) ++j;
    const fsdp::UnitPlan& u = p.units[i];
    for (const auto& f : u.flats) {
      std::string label = unit_label(u, f);
      if (label.size() > name_w) label = "..." + label.substr(label.size() - name_w + 3);
      char line[512];
      const int group = f.shard_size;
      std::snprintf(line, sizeof line, "  %-*s %14s %12s  %s", static_cast<int>(name_w), label.c_str(),
                    with_commas(f.numel).c_str(), group > 1 ? with_commas(f.shard_numel).c_str() : "whole",
                    group > 1 ? flat_bar(f, group, width).c_str() : "");
      os << line;
      if (u.is_ignored()) os << " (ignored: whole on every rank)";
      os << "\n";
    }
    if (j - i > 1) {
      os << "  ... and " << (j - i - 1) << " more unit" << (j - i > 2 ? "s" : "") << " with the same layout ("
         << p.units[i + 1].name << " .. " << p.units[j - 1].name << ")\n";
    }
    i = j;
  }
  (void)G;
  return os.str();
}

std::string describe_step_assumptions(const PlanSettings& ps) {
  const StepTimeSettings& t = ps.step;
  char b[1300];
  const int busy = ps.ranks_per_host * std::max(1, ps.threads);
  char cores[480];
  auto costs = [](const CoreCosts& k) {  // "bytes x a / b / c, + x / y / z us per collective"
    char c[160];
    std::snprintf(c, sizeof c, "bytes x %.3g / %.3g / %.3g, +%.4g / %.4g / %.4g us per collective", k.weight[0], k.weight[1],
                  k.weight[2], k.sync_us[0], k.sync_us[1], k.sync_us[2]);
    return std::string(c);
  };
  if (t.cores_per_host > 0 && t.cores_per_host < busy)
    std::snprintf(cores, sizeof cores,
                  "%d cores per host for %d ranks x %d threads: compute at %.2f of the rate; communication's core part "
                  "(all-gather / reduce-scatter / all-reduce; rings across the links: %s; inside hosts: %s) serialised "
                  "with it",
                  t.cores_per_host, ps.ranks_per_host, std::max(1, ps.threads), static_cast<double>(t.cores_per_host) / busy,
                  costs(t.link_cores).c_str(), costs(t.intra_cores).c_str());
  else if (t.cores_per_host > 0)
    std::snprintf(cores, sizeof cores, "%d cores per host for %d ranks x %d threads: communication overlaps compute",
                  t.cores_per_host, ps.ranks_per_host, std::max(1, ps.threads));
  else
    std::snprintf(cores, sizeof cores, "cores per host not given: communication overlaps compute");
  char opt[96] = "";
  if (t.optimizer_ns_per_param > 0)
    std::snprintf(opt, sizeof opt, " + the optimizer at %.3g ns per parameter of the rank's shards", t.optimizer_ns_per_param);
  if (t.compute_tflops > 0)
    std::snprintf(b, sizeof b, "compute %.4g TFLOP/s per rank (%s)%s; intra-host edge %.3g GB/s, link edges / W_e; latency %.3g us per ring step; %s",
                  t.compute_tflops, t.compute_source.c_str(), opt, t.intra_busbw_gbps, t.latency_us, cores);
  else
    std::snprintf(b, sizeof b, "no compute rate (communication only, none hidden); intra-host edge %.3g GB/s, link edges / W_e; latency %.3g us per ring step",
                  t.intra_busbw_gbps, t.latency_us);
  return b;
}

std::string format_plan(const PlanSettings& ps, const std::vector<StrategyPlan>& plans, int64_t device_bytes) {
  std::ostringstream os;
  const model::ModelSpec& sp = ps.spec;
  const int hosts = ps.ranks / ps.ranks_per_host;
  os << "# shardtrain plan: " << sp.arch << " (" << sp.n_layers << " x " << sp.d_model << ", " << sp.n_heads
     << " heads, " << with_commas(model::parameter_count(sp)) << " parameters)";
  if (model::input_kind(sp) == model::InputKind::Images) os << ", micro-batch " << ps.micro_batch << " images";
  else os << ", micro-batch " << ps.micro_batch << " x " << sp.seq_len << " tokens";
  os << ", grad_accum " << ps.grad_accum << "\n";
  os << "# " << ps.ranks << " rank" << (ps.ranks > 1 ? "s" : "") << " on " << hosts << " host" << (hosts > 1 ? "s" : "")
     << " (" << ps.ranks_per_host << " per host); device memory " << format_bytes(device_bytes) << " per rank; "
     << fsdp::dtype_name(ps.engine.mp.param_dtype) << " compute, " << fsdp::dtype_name(ps.engine.mp.reduce_dtype)
     << " reduce, " << ps.optimizer << "; activation checkpointing "
     << (ps.engine.activation_checkpointing ? "on" : "off") << " in the deck\n";
  if (ps.engine.cpu_offload)
    os << "# fsdp.cpu_offload = true: parameter and gradient shards and the optimizer state live in host memory;"
          " the peaks below are device memory without them (not measured on a GPU yet)\n";
  os << "# per rank, bytes at the step's peak (its instant on the last lines); communication per step, sent per rank\n\n";

  int col = 20;
  for (const auto& p : plans) col = std::max(col, static_cast<int>(p.mem.peak_at.size()) + 2);
  auto row = [&](const std::string& label, auto cell) {
    char b[64];
    std::snprintf(b, sizeof b, "%-26s", label.c_str());
    os << b;
    for (const auto& p : plans) {
      std::snprintf(b, sizeof b, "%*s", col, cell(p).c_str());
      os << b;
    }
    os << "\n";
  };
  row("", [](const StrategyPlan& p) { return std::string(fsdp::to_string(p.strategy)); });
  row("shard x replicate", [](const StrategyPlan& p) {
    return std::to_string(p.shard_size) + " x " + std::to_string(p.replicate_size);
  });
  row("params (fp32 shards)", [](const StrategyPlan& p) { return format_bytes(p.mem.params); });
  row("grads (fp32 shards)", [](const StrategyPlan& p) { return format_bytes(p.mem.grads); });
  row("optimizer state", [](const StrategyPlan& p) { return format_bytes(p.mem.optim); });
  row("unsharded params", [](const StrategyPlan& p) { return format_bytes(p.mem.unsharded); });
  row("unsharded grad buffers", [](const StrategyPlan& p) { return format_bytes(p.mem.grad_buffers); });
  row("activations + working", [](const StrategyPlan& p) { return format_bytes(p.mem.activations); });
  row(ps.engine.activation_checkpointing ? "peak (deck: recompute)" : "peak (deck)",
      [](const StrategyPlan& p) { return format_bytes(p.mem.total); });
  row("  of device memory", [&](const StrategyPlan& p) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f%%%s", 100.0 * p.mem.total / device_bytes, p.mem.total > device_bytes ? " OOM" : "");
    return std::string(b);
  });
  row("peak without recompute", [](const StrategyPlan& p) { return format_bytes(p.mem_no_recompute.total); });
  row("peak with recompute", [](const StrategyPlan& p) { return format_bytes(p.mem_recompute.total); });
  row("saved activations", [](const StrategyPlan& p) { return format_bytes(p.mem_no_recompute.saved_activations); });
  row("  with recompute", [](const StrategyPlan& p) { return format_bytes(p.mem_recompute.saved_activations); });
  row("all-gather / step", [](const StrategyPlan& p) { return format_bytes(p.comm.all_gather); });
  row("reduce-scatter / step", [](const StrategyPlan& p) { return format_bytes(p.comm.reduce_scatter); });
  row("all-reduce / step", [](const StrategyPlan& p) { return format_bytes(p.comm.all_reduce); });
  row("intra-host / step", [](const StrategyPlan& p) { return format_bytes(p.comm.intra_host); });
  row("inter-host / step", [](const StrategyPlan& p) { return format_bytes(p.comm.inter_host); });
  row("host link / step", [](const StrategyPlan& p) { return format_bytes(p.comm.inter_host_link); });
  // What each quantization option would leave between hosts (fsdp.quantize_weights / _grads).
  auto opt_bytes = [](int64_t b) { return b < 0 ? std::string("-") : format_bytes(b); };
  row("inter-host, plain", [&](const StrategyPlan& p) { return opt_bytes(p.inter_host_plain); });
  row("  + quantize_weights", [&](const StrategyPlan& p) { return opt_bytes(p.inter_host_qwz); });
  row("  + quantize_grads", [&](const StrategyPlan& p) { return opt_bytes(p.inter_host_qgz); });
  row("  + secondary_shards", [&](const StrategyPlan& p) { return opt_bytes(p.inter_host_hpz); });
  row("  + all that apply", [&](const StrategyPlan& p) { return opt_bytes(p.inter_host_all); });
  row("peak at", [](const StrategyPlan& p) { return p.mem.peak_at; });
  // The step-time estimate (step_time.h) with the deck's recomputation setting.
  auto ms = [](double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f ms", 1e3 * s);
    return std::string(b);
  };
  row("est. compute / step", [&](const StrategyPlan& p) { return ms(p.step.compute_s); });
  row("est. comm / step", [&](const StrategyPlan& p) { return ms(p.step.comm_s); });
  row("est. exposed comm", [&](const StrategyPlan& p) { return ms(p.step.exposed_s); });
  row("est. step", [&](const StrategyPlan& p) { return ms(p.step.step_s()); });
  os << "# step estimate: " << describe_step_assumptions(ps) << "\n";
  os << "\n";
  for (const auto& p : plans) os << sharding_diagram(ps, p) << "\n";

  bool rc = false;
  const int best = recommend(plans, device_bytes, &rc);
  if (best < 0) {
    int64_t least = plans.empty() ? 0 : plans[0].mem_recompute.total;
    for (const auto& p : plans) least = std::min(least, p.mem_recompute.total);
    os << "recommendation: nothing fits " << format_bytes(device_bytes) << " per rank (the smallest peak is "
       << format_bytes(least) << " with recomputation): use more ranks, a smaller micro-batch, or bf16\n";
  } else {
    const StrategyPlan& p = plans[best];
    const MemoryBreakdown& m = rc ? p.mem_recompute : p.mem_no_recompute;
    os << "recommendation: parallel.strategy = \"" << fsdp::to_string(p.strategy) << "\""
       << (rc ? " with fsdp.activation_checkpointing = true" : "") << " (peak " << format_bytes(m.total) << " of "
       << format_bytes(device_bytes) << ", " << format_bytes(p.comm.intra_host) << " intra-host + "
       << format_bytes(p.comm.inter_host) << " inter-host per rank, " << format_bytes(p.comm.inter_host_link)
       << " over each host's link per step; est. step " << ms((rc ? p.step_recompute : p.step_no_recompute).step_s())
       << "): the shortest estimated step among the strategies that fit"
       << (rc ? "; none fits without recomputation" : " without recomputation") << "\n";
  }
  return os.str();
}

}  // namespace shardtrain::train
