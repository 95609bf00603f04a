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

int64_t nf4_dequant_bytes(int64_t L, const fsdp::nf4::Format& f, bool cuda) {
  return fsdp::nf4::dequant_temp_bytes(L, f, cuda);
}

model::CostQuery cost_query(const fsdp::MixedPrecision& mp, int64_t micro_batch, int threads, const Target& target,
                            int64_t attention_span) {
  model::CostQuery q;
  q.micro_batch = micro_batch;
  q.compute_dtype = mp.param_dtype;
  q.keep_fp32 = mp.keep_fp32;
  q.threads = threads;
  q.cuda = target.cuda;
  q.fused_attention = target.fused_attention;
  q.attention_span = attention_span;
  return q;
}

ActivationBytes activation_bytes(const model::ModelSpec& spec, const fsdp::MixedPrecision& mp, int64_t micro_batch,
                                 int threads, const Target& target) {
  return model::build_model(spec, at::kMeta)->activation_bytes(cost_query(mp, micro_batch, threads, target));
}

namespace {
// One instant of the step: what it holds besides the persistent state.
struct Instant {
  std::string name;
  int64_t unsharded, grad_buffers, activations;
  bool with_optim = true;
  int64_t nf4_wire = 0;  // NF4 gathers in flight (their wire buffers)
};

}  // namespace

MemoryBreakdown peak_memory(const PlanSettings& ps, fsdp::Strategy st, const std::vector<fsdp::UnitPlan>& units, int S,
                            const ActivationBytes& a, bool rc) {
  const int64_t c = dtype_bytes(ps.engine.mp.reduce_dtype);
  const bool off = ps.engine.cpu_offload;
  MemoryBreakdown m;
  m.state_on_host = off;
  // Per unit: U, its unsharded parameter buffers (frozen flats too: they are gathered); G, its
  // gradient buffers and pend, its reduce-scatter's input and output (trainable flats only: a
  // frozen flat has neither, fsdp::FlatPlan::frozen); W, the wire buffers of its NF4 gathers
  // (fsdp::FlatPlan::nf4, S > 1: every rank's packed shard, S x shard_bytes(), until the gather
  // is waited for and dequantized into U); Usec, what hpZ keeps a secondary shard of (not the
  // NF4 flats: they are gathered as codes again).
  int64_t Ur = 0, Ub = 0, Gr = 0, Gb = 0, pend_r = 0, pend_b = 0, nb = 0, nb_grad = 0, max_shard = 0, trainable_elems = 0;
  int64_t Wb = 0, Ub_sec = 0, deq_b = 0;  // deq_b: a block's NF4 dequantization temporaries
  for (const auto& u : units) {
    int64_t U = 0, G = 0, pend = 0, W = 0, Usec = 0, deq = 0;
    for (const auto& f : u.flats) {
      if (f.frozen) {
        m.frozen += f.shard_bytes();
        if (f.nf4) m.frozen_nf4 += f.shard_bytes();
      } else {
        m.params += 4 * f.shard_numel;
        m.grads += 4 * f.shard_numel;
        trainable_elems += f.shard_numel;
        max_shard = std::max(max_shard, f.shard_numel);
      }
      if (f.aliases_master) continue;
      U += f.full_bytes();
      if (!f.nf4) {
        Usec += f.full_bytes();
      } else {
        if (f.shard_size > 1) W += f.shard_size * f.shard_bytes();
        deq = std::max(deq, nf4_dequant_bytes(f.shard_numel, f.nf4_format, ps.target.cuda));  // one slice at a time
      }
      if (f.frozen) continue;
      G += f.full_bytes();
      if (f.shard_size > 1) pend += f.padded * c + f.shard_numel * c;
    }
    if (u.is_root()) {
      Ur = U;
      Gr = G;
      pend_r = pend;
    } else if (!u.is_ignored()) {
      ++nb;
      if (G > 0) ++nb_grad;
      Ub = std::max(Ub, U);
      Wb = std::max(Wb, W);
      deq_b = std::max(deq_b, deq);
      Ub_sec = std::max(Ub_sec, Usec);
      Gb = std::max(Gb, G);
      pend_b = std::max(pend_b, pend);
    }
  }
  if (ps.optimizer == "adamw") m.optim = 8 * trainable_elems;
  else if (ps.sgd_momentum != 0) m.optim = 4 * trainable_elems;
  // DiLoCo: the outer copy of the trainable shards and the outer momentum (fp32; the engine keeps
  // the momentum buffer whatever diloco.outer_momentum), sharded like the optimizer state and
  // held like it from the first step on (not at init).
  if (runs_diloco(ps, st, S)) m.outer = 8 * trainable_elems;
  // With cpu_offload the shards (frozen ones too) and the optimizer state are host memory: the
  // peak counts the device (initialisation and clipping run on the host too). The host holds
  // them and the staging of up to fsdp::kMaxPendingCopies gradient copies (fp32 shards).
  const int64_t state = off ? 0 : m.state();
  if (off) m.host = m.state() + static_cast<int64_t>(fsdp::kMaxPendingCopies) * 4 * max_shard;

  const bool reshard_fwd = fsdp::reshards_after_forward(st);
  const bool no_shard = st == fsdp::Strategy::NoShard;
  const int64_t U_fwd_end = Ur + (reshard_fwd ? 0 : nb * Ub);
  const bool prefetch = ps.engine.backward_prefetch == fsdp::BackwardPrefetch::Pre;
  // The root is resharded (and its gradients reduced) once all its trainable parameters have
  // their gradients: at the end of backward when the embeddings train, else (a frozen embedding
  // with a trainable final norm or head, or nothing in the root that trains: LoRA) before the
  // blocks' backward starts (the engine's pre_backward of the first block).
  const bool root_early = !no_shard && !a.embedding_trains;
  const int64_t Ur_bwd = root_early ? 0 : Ur, Gr_bwd = root_early ? 0 : Gr;
  const int64_t U_end = no_shard ? Ur + nb * Ub : Ur_bwd;
  // fsdp.secondary_shards (hpZ, full_shard): each block keeps 1/node of its unsharded bytes from
  // its forward until its backward gathers it (the block in backward and the one prefetched have
  // taken theirs).
  const int Gn = runtime::mesh_shard_size(ps.shard_group_size, ps.ranks_per_host);
  const int64_t sec =
      ps.engine.compression.secondary_shards && fsdp::compression_support(st).secondary_shards && Gn > 0 ? Ub_sec / Gn : 0;
  auto secs = [&](int64_t taken) { return std::max<int64_t>(0, nb - taken) * sec; };
  // A finished block's reduce-scatter input and output stay until it is retired, and the
  // engine retires by count only: fsdp::kMaxPendingReductions (2) are kept, whether or not
  // they have completed, so two are held once two blocks have finished, in every run.
  static_assert(fsdp::kMaxPendingReductions == 2, "the instants below follow two pending reductions");
  constexpr int64_t kMaxPending = static_cast<int64_t>(fsdp::kMaxPendingReductions);
  const int64_t pending = !no_shard && S > 1 ? pend_b : 0;
  const int64_t pending_root = root_early && S > 1 ? pend_r : 0;
  // Pending when the k-th block from the top starts its backward: the last two of (the root's,
  // released early) and the k blocks' before it.
  auto pending_at = [&](int64_t k) {
    if (pending_root == 0) return std::min(k, kMaxPending) * pending;
    return k == 0 ? pending_root : k == 1 ? pending_root + pending : kMaxPending * pending;
  };
  const int64_t pending_end =
      pending_root > 0 && nb_grad < kMaxPending ? pending_at(nb_grad) : std::min<int64_t>(nb_grad, kMaxPending) * pending;
  const int64_t L = static_cast<int64_t>(a.blocks.size());
  int64_t all_blocks_saved = 0, L_bwd = 0;  // L_bwd: the blocks backward runs through (recomputed)
  for (const auto& blk : a.blocks) {
    all_blocks_saved += blk.saved;
    L_bwd += blk.backward ? 1 : 0;
  }

  std::vector<Instant> at;
  // Recomputation keeps the input of each block backward runs through (fsdp's recompute node);
  // the frozen blocks below them run plainly and keep nothing.
  const int64_t kept = rc ? a.inputs + a.embed_saved_rc + L_bwd * a.block_io + a.last_out_kept
                          : a.inputs + a.embed_saved + all_blocks_saved;
  at.push_back({"loss", U_fwd_end + secs(0), 0, kept + a.head_saved + a.head_fwd_work});
  at.push_back({"loss backward", U_fwd_end + secs(0), 0, kept + a.head_saved + a.head_bwd_work});
  at.push_back({"head backward", U_fwd_end + secs(0), Gr, kept + a.head_saved + a.head_bwd_mm});
  at.push_back({"final norm backward", U_fwd_end + secs(0), Gr, kept + a.final_norm_bwd});
  // The blocks' backward from the last one down, as far as backward goes (it stops below the
  // lowest block with anything that trains). Block j (k-th from the top) holds: the root and
  // its own unsharded buffers (+ the next one prefetched, under reshard-after-forward), or every
  // block from its forward on; the root's and its gradient buffers; pending reductions of the
  // k blocks before it (at most two); without recomputation the blocks below it and its own
  // saved set (its output released with the next block's), with recomputation every block's
  // input and its own recomputed set; and its working memory.
  static const char* const kNames[] = {"last block backward", "next-to-last block backward",
                                       "third-to-last block backward"};
  int64_t below = all_blocks_saved;  // saved by blocks 0 .. j
  for (int64_t j = L - 1, k = 0; j >= 0 && a.blocks[static_cast<size_t>(j)].backward; --j, ++k) {
    const BlockBytes& blk = a.blocks[static_cast<size_t>(j)];
    const int64_t pf = prefetch && j >= 1 ? 1 : 0;
    const int64_t U = reshard_fwd ? Ur_bwd + Ub * (1 + pf) : Ur_bwd + std::max<int64_t>(0, nb - k) * Ub;
    const int64_t act = rc ? a.inputs + a.embed_saved_rc + L_bwd * a.block_io + a.grad_in + a.held_grad + blk.saved +
                                 (blk.out_saved == 0 ? a.block_io : 0) + blk.bwd_work
                           : a.inputs + a.embed_saved + below - blk.out_saved + a.grad_in + a.held_grad + blk.bwd_work;
    const std::string name = k < 3 ? kNames[k] : "block " + std::to_string(j) + " backward";
    // The block prefetched below it is gathered during this one's backward: its NF4 gathers hold
    // their wire buffers until its own backward waits for them (the last flats a unit issues, so
    // they are the ones limit_all_gathers leaves in flight).
    const int64_t wire = reshard_fwd ? pf * Wb : 0;
    at.push_back({name, U + secs(k + 1 + pf), Gr_bwd + Gb + pending_at(k), act, true, wire});
    // Before its backward computes, the block's NF4 flats are dequantized (the waited gather's
    // slices, its wire still held; or, on one rank, the prefetched block's shard in place): the
    // same buffers without the block's working memory, with the dequantization's temporaries.
    if (reshard_fwd && deq_b > 0)
      at.push_back({name + " (NF4 dequantization)", U + secs(k + 1 + pf), Gr_bwd + Gb + pending_at(k),
                    act - blk.bwd_work + deq_b, true, Wb});
    below -= blk.saved;
  }
  // Recomputation nodes keep their block's input until the graph is freed after backward.
  at.push_back({"embedding backward", U_end, Gr_bwd + pending_end,
                a.inputs + a.embed_bwd + (rc ? L_bwd * a.block_io + a.embed_saved_rc : 0)});
  // clip_grad_norm: one chunk of the trainable shards squared in fp64 (fsdp::kNormChunkElems),
  // on the host too.
  if (!off) at.push_back({"clip", U_end, 0, 8 * std::min<int64_t>(max_shard, fsdp::kNormChunkElems)});

  // Sharded initialisation (fsdp::Engine, materialize): one flat at a time, the whole flat
  // in fp32, one parameter's init values, then this rank's slice at rest (a trainable flat's
  // fp32 master, a frozen one's in its dtype) and the empty compute-dtype buffer, over what the
  // flats before it keep (masters and gradient shards; frozen shards).
  int64_t prior = 0, init_peak = 0;
  for (const auto& u : units) {
    for (const auto& f : u.flats) {
      int64_t max_param = 0;
      for (const auto& pr : f.params) max_param = std::max(max_param, pr.numel);
      // Aliased, the flat is its master: the fp32 flat itself, or (frozen) its copy in its dtype.
      const int64_t copy = f.aliases_master ? (f.dtype == at::kFloat ? 0 : f.full_bytes()) : f.shard_bytes() + f.full_bytes();
      init_peak = std::max(init_peak, prior + 4 * f.padded + std::max(4 * max_param, copy));
      prior += f.frozen ? (f.aliases_master ? f.full_bytes() : f.shard_bytes()) : 8 * f.shard_numel;
    }
  }
  const int64_t at_rest = m.params + m.grads + m.frozen;
  if (!off) at.push_back({"init", 0, 0, init_peak - at_rest, false});

  int64_t best = -1;
  for (const auto& i : at) {
    const int64_t total = (i.with_optim ? state : at_rest) + i.unsharded + i.nf4_wire + i.grad_buffers + i.activations;
    if (total > best) {
      best = total;
      m.unsharded = i.unsharded;
      m.nf4_wire = i.nf4_wire;
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
