// Memory planner: units and flat layouts (the engine's wrap policy on a meta model), persistent
// state, unsharded buffers, activations and communication per strategy; see
// docs/memory-planner.md for the formulas and the measurements that check them.
#include "shardtrain/train/memory_plan.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/forward_hook.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"

namespace shardtrain::train {
namespace {

bool matches_any(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns)
    if (!p.empty() && name.find(p) != std::string::npos) return true;
  return false;
}

int64_t pad_to(int64_t numel, int S) { return std::max<int64_t>(S, (numel + S - 1) / S * S); }

int64_t dtype_bytes(at::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

}  // namespace

int64_t UnitLayout::numel() const {
  int64_t n = 0;
  for (const auto& f : flats) n += f.numel;
  return n;
}

// ---- units: the engine's wrap policy (src/fsdp/engine.cpp, Engine::Engine) ------------------

std::vector<UnitLayout> layout_units(const model::ModelSpec& spec, const fsdp::EngineOptions& opts) {
  std::shared_ptr<model::Model> root = model::build_model(spec, at::kMeta);
  std::vector<std::pair<std::string, torch::nn::Module*>> modules;
  modules.emplace_back("", root.get());
  for (auto& item : root->named_modules("", /*include_self=*/false)) modules.emplace_back(item.key(), item.value().get());

  // Distinct parameters (tied weights once, under their first qualified name), in discovery order.
  struct Param {
    std::string name;
    int64_t numel;
  };
  std::vector<Param> params;
  std::vector<const void*> seen;
  for (auto& [prefix, mod] : modules)
    for (auto& item : mod->named_parameters(/*recurse=*/false)) {
      const void* key = item.value().unsafeGetTensorImpl();
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
      seen.push_back(key);
      params.push_back({prefix.empty() ? item.key() : prefix + "." + item.key(), item.value().numel()});
    }

  auto under = [](const std::string& name, const std::string& prefix) {
    return prefix.empty() || name.compare(0, prefix.size() + 1, prefix + ".") == 0;
  };
  std::vector<std::string> unit_prefix{""};
  if (!opts.wrap_types.empty() || opts.min_num_params > 0) {
    std::vector<bool> claimed(params.size(), false), is_unit(modules.size(), false);
    for (size_t mi = modules.size(); mi-- > 1;) {
      auto* mod = modules[mi].second;
      if (!dynamic_cast<fsdp::Hookable*>(mod)) continue;
      const std::string& prefix = modules[mi].first;
      const bool by_type = std::find(opts.wrap_types.begin(), opts.wrap_types.end(), mod->name()) != opts.wrap_types.end();
      int64_t unclaimed = 0;
      for (size_t pi = 0; pi < params.size(); ++pi)
        if (!claimed[pi] && under(params[pi].name, prefix) && !matches_any(params[pi].name, opts.ignored))
          unclaimed += params[pi].numel;
      const bool by_size = opts.min_num_params > 0 && unclaimed >= opts.min_num_params;
      if (!(by_type || by_size) || unclaimed == 0) continue;
      is_unit[mi] = true;
      for (size_t pi = 0; pi < params.size(); ++pi)
        if (under(params[pi].name, prefix)) claimed[pi] = true;
    }
    for (size_t mi = 1; mi < modules.size(); ++mi)
      if (is_unit[mi]) unit_prefix.push_back(modules[mi].first);
  }

  std::vector<std::vector<const Param*>> members(unit_prefix.size());
  std::vector<const Param*> ignored;
  for (const auto& p : params) {
    if (matches_any(p.name, opts.ignored)) {
      ignored.push_back(&p);
      continue;
    }
    size_t best = 0;
    for (size_t ui = 1; ui < unit_prefix.size(); ++ui)
      if (under(p.name, unit_prefix[ui]) && unit_prefix[ui].size() > unit_prefix[best].size()) best = ui;
    members[best].push_back(&p);
  }

  auto make_flat = [](const std::vector<const Param*>& ps, at::ScalarType dtype) {
    FlatLayout f;
    f.dtype = dtype;
    for (const Param* p : ps) {
      f.params.emplace_back(p->name, p->numel);
      f.numel += p->numel;
    }
    return f;
  };
  std::vector<UnitLayout> units;
  for (size_t ui = 0; ui < unit_prefix.size(); ++ui) {
    UnitLayout u;
    u.name = ui == 0 ? "<root>" : unit_prefix[ui];
    u.is_root = ui == 0;
    std::vector<const Param*> compute, fp32;
    for (const Param* p : members[ui]) {
      const bool keep = opts.mp.param_dtype != at::kFloat && matches_any(p->name, opts.mp.keep_fp32);
      (keep ? fp32 : compute).push_back(p);
    }
    if (!compute.empty()) u.flats.push_back(make_flat(compute, opts.mp.param_dtype));
    if (!fp32.empty()) u.flats.push_back(make_flat(fp32, at::kFloat));
    units.push_back(std::move(u));
  }
  if (!ignored.empty()) {
    UnitLayout u;
    u.name = "<ignored>";
    u.is_ignored = true;
    u.flats.push_back(make_flat(ignored, at::kFloat));
    units.push_back(std::move(u));
  }
  return units;
}

void pad_units(std::vector<UnitLayout>& units, int S) {
  for (auto& u : units)
    for (auto& f : u.flats) {
      const int s = u.is_ignored ? 1 : S;  // the ignored group is kept whole (group size 1)
      f.padded = pad_to(f.numel, s);
      f.shard_numel = f.padded / s;
    }
}

// ---- activations: what autograd saves in src/model, per micro-batch -------------------------
//
// Derived by reading the model code and counting what each op saves (libtorch 1.13: ops save an
// input only when the other input needs its gradient; `mean` saves its input, `sum` does not;
// matmul copies a non-contiguous [B, H, T, hd] operand before bmm and bmm saves the copy), then
// checked tensor by tensor against the counting allocator (docs/memory-planner.md). Notation:
// n tokens per micro-batch, d model width, f MLP width, H heads, T attention length, V vocab,
// b bytes of the compute dtype; "attn" = B*H*T*T elements.

namespace {

struct Shape {
  int64_t B = 1, T = 1, n = 1, d = 1, f = 1, H = 1, hd = 1, V = 0, b = 4, image = 0;
  bool mixed = false;   // compute dtype is not fp32
  bool norm32 = false;  // mixed precision with the norms' parameters kept in fp32
  bool causal = true;
  int64_t attn() const { return B * H * T * T; }
};

}  // namespace

int64_t ActivationBytes::saved(bool recompute) const {
  if (recompute) return inputs + embed_saved_rc + blocks * block_io + last_out_kept + head_saved;
  return inputs + embed_saved + blocks * block_saved + head_saved;
}

ActivationBytes activation_bytes(const model::ModelSpec& spec, const fsdp::MixedPrecision& mp, int64_t micro_batch,
                                 int threads) {
  const model::ModelSpec s = model::resolve_spec(spec);
  Shape x;
  x.B = micro_batch;
  x.d = s.d_model;
  x.f = s.d_ff;
  x.H = s.n_heads;
  x.hd = s.d_model / s.n_heads;
  x.b = dtype_bytes(mp.param_dtype);
  x.mixed = mp.param_dtype != at::kFloat;
  const std::string norm_name = s.arch == "gpt2" ? "transformer.h.0.ln_1.weight"
                                : s.arch == "llama" ? "model.layers.0.input_layernorm.weight"
                                                    : "blocks.0.norm1.weight";
  x.norm32 = x.mixed && matches_any(norm_name, mp.keep_fp32);
  if (s.arch == "vit") {
    const int64_t patches = (s.image_size / s.patch_size) * (s.image_size / s.patch_size);
    x.T = patches + 1;
    x.causal = false;
    x.image = s.channels * s.image_size * s.image_size;
  } else {
    x.T = s.seq_len;
    x.V = s.vocab_size;
  }
  x.n = x.B * x.T;
  const int64_t n = x.n, d = x.d, f = x.f, b = x.b, nd = n * d, nf = n * f, attn = x.attn();

  ActivationBytes a;
  a.blocks = s.n_layers;
  // libtorch 1.13's bf16/fp16 GEMM on CPU packs its operands in a per-thread buffer (tensor
  // memory). For a weight gradient [M, N] reduced over the n tokens it measured about 673
  // bytes per token up to 512 tokens and 476 KB beyond when M >= 256, proportionally less for
  // narrower M (more for very wide layers: 1.3 MiB at 2048 x 768). fp32 GEMMs (MKL/OpenBLAS)
  // allocate no tensors.
  auto gemm_ws = [&](int64_t M) -> int64_t {
    if (!x.mixed) return 0;
    const int64_t full = n <= 512 ? 673 * n : 476160;
    return static_cast<int64_t>(std::max(1, threads)) * full * std::min<int64_t>(M, 256) / 256;
  };
  // The MLP's second projection: GPT-2's Conv1D weight is [f, d] (M = f), Linear's [d, f].
  a.gemm_ws = gemm_ws(s.arch == "gpt2" ? f : d);
  a.grad_in = b * nd;
  a.block_io = b * nd;
  // Softmax runs in fp32 (its output is saved); under mixed precision bmm saves a b-byte copy.
  const int64_t probs = x.mixed ? (4 + b) * attn : 4 * attn;
  const int64_t probs_b = x.mixed ? b * attn : 0;
  const int64_t mask = x.causal ? x.T * x.T : 0;  // bool [T, T], saved by masked_fill
  // Whether a norm saves its input tensor itself (fp32, or norms in the compute dtype) rather
  // than an fp32 copy of it. Then each block's output stays alive until the next block's norm
  // runs backward, and is counted in the block that produced it.
  bool input_kept;

  if (s.arch == "llama") {
    // RMSNorm: h = x.to(fp32); h*rsqrt(mean(h^2)+eps) -> .to(b) * weight.to(b).
    // Saves h (a copy unless fp32), pow(h, 2) (mean saves its input), the normalised
    // tensor (b), the output (b; saved by the projections), rsqrt [n, 1] and, with fp32
    // weights under mixed precision, the weight's b-byte copy.
    const int64_t rms = x.mixed ? 8 * nd + 2 * b * nd + 4 * n + (x.norm32 ? b * d : 0) : 12 * nd + 4 * n;
    input_kept = !x.mixed;
    a.norm_saved = rms;
    // Attention: q and k after rotation and the repeat_kv/transposes are copied for bmm
    // (H heads each), v (H heads) and the merged heads; under mixed precision each use of
    // the fp32 rotary tables makes a b-byte copy that mul saves (cos and sin, for q and k).
    const int64_t attn_saved = 4 * b * nd + probs + mask + (x.mixed ? 4 * b * x.T * x.hd : 0);
    // SwiGLU: gate, silu(gate), up, silu*up.
    const int64_t mlp_saved = 4 * b * nf;
    const int64_t h_saved = input_kept ? b * nd : 0;  // the residual h, saved by the second norm
    const int64_t out_saved = input_kept ? b * nd : 0;
    a.block_saved = 2 * rms + attn_saved + mlp_saved + h_saved + out_saved;
    a.block_out_saved = out_saved;
    // Backward of one block, relative to its start: down_proj (weight and input grads), then
    // the product's two grads; attention peaks in softmax backward (fp32 grad in and out)
    // after the MLP, the second norm, h, the merged heads and v' are released.
    a.block_bwd_mlp = std::max(b * f * d + b * nf + a.gemm_ws, 2 * b * nf);
    a.block_bwd_attn = -(mlp_saved + rms + h_saved + 2 * b * nd + probs_b) + b * nd + 8 * attn;
    // Embedding output (kept by the first norm when fp32) and the fp32 rotary tables (saved
    // by mul in fp32; captured by every block body under recomputation).
    const int64_t rope = 2 * 4 * x.T * x.hd;
    a.embed_saved = (input_kept ? b * nd + rope : 0);
    a.embed_saved_rc = rope;
    a.head_saved = rms;
  } else {
    // LayerNorm: with fp32 weights under mixed precision, layer_norm(x.to(fp32)).to(b): saves
    // the fp32 copy, mean and rstd, and the b output (saved by the next projection); otherwise
    // it saves its input itself, mean, rstd and the output.
    const int64_t ln = x.norm32 ? 4 * nd + 8 * n + b * nd : b * nd + 8 * n;
    input_kept = !x.norm32;
    a.norm_saved = ln;
    // Attention: q', k', v' (bmm copies of the [B, H, T, hd] views), merged heads.
    const int64_t attn_saved = 4 * b * nd + probs + mask;
    // MLP: c_fc output (saved by gelu) and gelu output (saved by c_proj).
    const int64_t mlp_saved = 2 * b * nf;
    const int64_t h_saved = input_kept ? b * nd : 0;
    const int64_t out_saved = input_kept ? b * nd : 0;
    a.block_saved = 2 * ln + attn_saved + mlp_saved + h_saved + out_saved;
    a.block_out_saved = out_saved;
    // Backward: c_proj of the MLP (input grad [n, f], weight grad [f, d], bias); attention
    // peaks in softmax backward after the MLP, ln_2, h, merged heads, v' (and the b copy of
    // the probabilities) are released, with v's gradient waiting for q's and k's.
    a.block_bwd_mlp = b * nf + b * f * d + a.gemm_ws + b * d;
    a.block_bwd_attn = -(mlp_saved + ln + h_saved + 2 * b * nd + probs_b) + b * nd + 8 * attn;
    if (s.arch == "gpt2") {
      a.embed_saved = input_kept ? b * nd : 0;  // wte(ids) + wpe, kept by the first ln_1
      a.embed_saved_rc = 0;
    } else {
      // ViT: the patch matrix (saved by the projection for its weight gradient) and the
      // tokens entering the first block.
      const int64_t patches = b * x.B * x.image;
      a.embed_saved = patches + (input_kept ? b * nd : 0);
      a.embed_saved_rc = patches;
    }
    a.head_saved = ln;
  }
  a.last_out_kept = input_kept ? b * nd : 0;
  if (s.dropout > 0) {
    // Dropout (training mode) is input * noise with a noise tensor of the input's size and
    // dtype, which mul saves; the output replaces the input downstream. Per block: the noise of
    // both residual branches (the branch outputs themselves are then freed), and on the
    // attention probabilities the noise and the dropped-out copy that bmm now saves (fp32: next
    // to the softmax output; mixed: instead of the b-byte copy). All of it is released before
    // the block's softmax backward. The root adds the embedding dropout's noise.
    const int64_t extra = 2 * b * nd + (x.mixed ? b * attn : 2 * b * attn);
    a.block_saved += extra;
    a.block_bwd_attn -= extra;
    // Llama's SwiGLU-product moment comes after the MLP branch's noise and down_proj's input
    // gradient are gone (GPT-2's and ViT's MLP peak is in the projection itself).
    if (s.arch == "llama") a.block_bwd_mlp = std::max(b * f * d + b * nf + a.gemm_ws, 2 * b * nf - b * nd);
    a.embed_saved += b * nd;
    a.embed_saved_rc += b * nd;
  }

  if (s.arch == "vit") {
    a.inputs = 4 * x.B * x.image + 8 * x.B + (x.mixed ? b * x.B * x.image : 0);
    const int64_t logits = 4 * x.B * s.num_classes;
    a.head_fwd_work = 2 * logits;
    a.head_bwd_work = 3 * logits;
    a.head_bwd_mm = logits + 4 * x.B * d + 4 * d * s.num_classes;
  } else {
    const int64_t V = x.V;
    a.inputs = 2 * 8 * n;  // token ids and targets, int64
    // Loss: fp32 logits and log-softmax (the b logits are freed when cast); backward of the
    // loss: log-softmax output, nll grad and log-softmax grad, all [n, V] fp32.
    a.head_fwd_work = 8 * n * V;
    a.head_bwd_work = 12 * n * V;
    // Head projection backward: logits grad (b), input grad and weight grad.
    a.head_bwd_mm = b * n * V + b * nd + b * V * d + gemm_ws(d);
    const bool tied = s.tie_embeddings;
    // A tied embedding's head gradient waits in autograd's input buffer until the embedding's
    // own gradient arrives at the end of backward; then both and their sum exist at once.
    a.held_grad = tied ? b * V * d : 0;
    a.embed_bwd = (tied ? 3 : 1) * b * V * d + (s.arch == "gpt2" ? b * s.seq_len * d : 0);
  }
  return a;
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

// fsdp::FlatParam::aliases_master: an fp32 flat that nobody shards is its own master (never
// with cpu_offload, which keeps the master apart from the compute buffer).
bool aliases(const FlatLayout& f, int group, bool offload) { return group == 1 && f.dtype == at::kFloat && !offload; }

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
MemoryBreakdown peak_memory(const PlanSettings& ps, fsdp::Strategy st, const std::vector<UnitLayout>& units, int S,
                            const ActivationBytes& a, bool rc) {
  const int64_t c = dtype_bytes(ps.engine.mp.reduce_dtype);
  const bool off = ps.engine.cpu_offload;
  MemoryBreakdown m;
  m.state_on_host = off;
  int64_t Ur = 0, Ub = 0, pend_b = 0, nb = 0, max_shard = 0;
  for (const auto& u : units) {
    const int group = u.is_ignored ? 1 : S;
    int64_t U = 0, pend = 0;
    for (const auto& f : u.flats) {
      m.params += 4 * f.shard_numel;
      m.grads += 4 * f.shard_numel;
      max_shard = std::max(max_shard, f.shard_numel);
      if (aliases(f, group, off)) continue;
      U += f.padded * f.elem_bytes();
      if (group > 1) pend += f.padded * c + f.shard_numel * c;
    }
    if (u.is_root) {
      Ur = U;
    } else if (!u.is_ignored) {
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
  // A finished block's reduce-scatter input and output stay until it is retired: completed
  // ones at the next block's reduce, and at most kMaxPendingReductions = 2 are kept. Whether
  // one or two are held depends on timing, so the plan takes the bound (two once two blocks
  // have finished).
  const int64_t pending = !no_shard && S > 1 ? pend_b : 0;
  const int64_t pending_end = std::min<int64_t>(nb, 2) * pending;
  const int64_t L = a.blocks;
  const int64_t bwd_work = std::max(a.block_bwd_mlp, a.block_bwd_attn);

  std::vector<Instant> at;
  if (!rc) {
    const int64_t saved_all = a.inputs + a.embed_saved + L * a.block_saved + a.head_saved;
    const int64_t B0 = a.inputs + a.embed_saved + L * a.block_saved - a.block_out_saved + a.grad_in + a.held_grad;
    at.push_back({"loss", U_fwd_end, 0, saved_all + a.head_fwd_work});
    at.push_back({"loss backward", U_fwd_end, 0, saved_all + a.head_bwd_work});
    at.push_back({"head backward", U_fwd_end, Gr, saved_all + a.head_bwd_mm});
    at.push_back({"last block backward", U_blk, Gr + Gb, B0 + bwd_work});
    if (L >= 2) at.push_back({"next-to-last block backward", U_blk2, Gr + Gb + pending, B0 - a.block_saved + bwd_work});
    if (L >= 3) at.push_back({"third-to-last block backward", U_blk3, Gr + Gb + 2 * pending, B0 - 2 * a.block_saved + bwd_work});
  } else {
    const int64_t kept = a.inputs + a.embed_saved_rc + L * a.block_io + a.last_out_kept;
    const int64_t B0 = a.inputs + a.embed_saved_rc + L * a.block_io + a.grad_in + a.held_grad + a.block_saved +
                       (a.block_out_saved == 0 ? a.block_io : 0);
    at.push_back({"loss", U_fwd_end, 0, kept + a.head_saved + a.head_fwd_work});
    at.push_back({"loss backward", U_fwd_end, 0, kept + a.head_saved + a.head_bwd_work});
    at.push_back({"head backward", U_fwd_end, Gr, kept + a.head_saved + a.head_bwd_mm});
    at.push_back({"last block backward", U_blk, Gr + Gb, B0 + bwd_work});
    // The next block recomputes the same activations while the previous block's reduction is
    // still pending (its inputs stay with the recomputation nodes).
    if (L >= 2) at.push_back({"next-to-last block backward", U_blk2, Gr + Gb + pending, B0 + bwd_work});
    if (L >= 3) at.push_back({"third-to-last block backward", U_blk3, Gr + Gb + 2 * pending, B0 + bwd_work});
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
    const int group = u.is_ignored ? 1 : S;
    for (const auto& f : u.flats) {
      int64_t max_param = 0;
      for (const auto& pr : f.params) max_param = std::max(max_param, pr.second);
      const int64_t extra = aliases(f, group, off) ? 4 * max_param
                                              : std::max(4 * max_param, 4 * f.shard_numel + f.padded * f.elem_bytes());
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
  p.units = layout_units(ps.spec, eo);
  pad_units(p.units, S);
  const ActivationBytes a = activation_bytes(ps.spec, ps.engine.mp, ps.micro_batch, ps.threads);
  p.mem_no_recompute = detail::peak_memory(ps, st, p.units, S, a, false);
  p.mem_recompute = detail::peak_memory(ps, st, p.units, S, a, true);
  p.mem = ps.engine.activation_checkpointing ? p.mem_recompute : p.mem_no_recompute;

  // Communication per rank per step (ring algorithms: an all-gather or reduce-scatter over S
  // ranks sends (S-1)/S of the buffer, an all-reduce over R ranks 2(R-1)/R).
  const int64_t b_reduce = dtype_bytes(ps.engine.mp.reduce_dtype);
  double ag = 0, rs = 0, ar_rep = 0, ar_world = 0;
  const double ring = S > 1 ? static_cast<double>(S - 1) / S : 0.0;
  const int R = p.replicate_size;
  for (const auto& u : p.units) {
    for (const auto& f : u.flats) {
      if (u.is_ignored) {
        if (N > 1) ar_world += 4.0 * f.numel * 2.0 * (N - 1) / N;
        continue;
      }
      const int gathers = u.is_root ? 1 : (fsdp::reshards_after_forward(st) ? 2 : 1);
      if (st != fsdp::Strategy::NoShard) {
        ag += ps.grad_accum * gathers * ring * f.padded * f.elem_bytes();
        rs += ps.grad_accum * ring * f.padded * b_reduce;
      }
      if (R > 1) ar_rep += 4.0 * f.shard_numel * 2.0 * (R - 1) / R;
    }
  }
  p.comm.all_gather = static_cast<int64_t>(ag);
  p.comm.reduce_scatter = static_cast<int64_t>(rs);
  p.comm.all_reduce = static_cast<int64_t>(ar_rep + ar_world);
  const int64_t shard_part = p.comm.all_gather + p.comm.reduce_scatter;
  (p.shard_spans_hosts ? p.comm.inter_host : p.comm.intra_host) += shard_part;
  (p.replicate_spans_hosts || (st == fsdp::Strategy::NoShard && N > G) ? p.comm.inter_host : p.comm.intra_host) +=
      p.comm.all_reduce;
  // What crosses the busiest host's link, and the cost of each family of rings: bytes per rank
  // times max(1, W x edges that share the link): a ring runs at its slowest edge, and the rings
  // of one family run at the same time (hybrid_shard's replicate groups all cross one link).
  // Ignored units' all-reduces run over the world (a replicate family of shard size 1).
  const int es = ring_edges_leaving_busiest_host(N, G, S, true);
  const int er = ring_edges_leaving_busiest_host(N, G, S, false);
  const int ew = ring_edges_leaving_busiest_host(N, G, 1, false);
  p.comm.inter_host_link = static_cast<int64_t>(es * (ag + rs) + er * ar_rep + ew * ar_world);
  auto cost = [&](double bytes, int edges) { return bytes * std::max(1.0, ps.inter_host_weight * edges); };
  p.comm_cost = cost(ag + rs, es) + cost(ar_rep, er) + cost(ar_world, ew);
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
    for (size_t i = 0; i < plans.size(); ++i) {
      const MemoryBreakdown& m = pass == 0 ? plans[i].mem_no_recompute : plans[i].mem_recompute;
      if (m.total > device_bytes) continue;
      if (best < 0 || plans[i].comm_cost < plans[best].comm_cost ||
          (plans[i].comm_cost == plans[best].comm_cost &&
           m.total < (pass == 0 ? plans[best].mem_no_recompute : plans[best].mem_recompute).total)) {
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
std::string flat_bar(const FlatLayout& f, int S, int width) {
  std::string bar(width, ' ');
  for (int i = 0; i < width; ++i) {
    const int64_t e = static_cast<int64_t>((static_cast<double>(i) + 0.5) * f.padded / width);
    bar[i] = e >= f.numel ? '.' : rank_symbol(static_cast<int>(std::min<int64_t>(S - 1, e / f.shard_numel)));
  }
  return "[" + bar + "]";
}

std::string unit_label(const UnitLayout& u, const FlatLayout& f) {
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
    auto same = [&](const UnitLayout& a, const UnitLayout& b) {
      if (a.is_root || b.is_root || a.is_ignored != b.is_ignored || a.flats.size() != b.flats.size()) return false;
      for (size_t k = 0; k < a.flats.size(); ++k)
        if (a.flats[k].numel != b.flats[k].numel || a.flats[k].dtype != b.flats[k].dtype) return false;
      return true;
    };
    while (j < p.units.size() && same(p.units[i], p.units[j])) ++j;
    const UnitLayout& u = p.units[i];
    for (const auto& f : u.flats) {
      std::string label = unit_label(u, f);
      if (label.size() > name_w) label = "..." + label.substr(label.size() - name_w + 3);
      char line[512];
      const int group = u.is_ignored ? 1 : S;
      std::snprintf(line, sizeof line, "  %-*s %14s %12s  %s", static_cast<int>(name_w), label.c_str(),
                    with_commas(f.numel).c_str(), group > 1 ? with_commas(f.shard_numel).c_str() : "whole",
                    group > 1 ? flat_bar(f, group, width).c_str() : "");
      os << line;
      if (u.is_ignored) os << " (ignored: whole on every rank)";
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

std::string format_plan(const PlanSettings& ps, const std::vector<StrategyPlan>& plans, int64_t device_bytes) {
  std::ostringstream os;
  const model::ModelSpec& sp = ps.spec;
  const int hosts = ps.ranks / ps.ranks_per_host;
  os << "# shardtrain plan: " << sp.arch << " (" << sp.n_layers << " x " << sp.d_model << ", " << sp.n_heads
     << " heads, " << with_commas(model::parameter_count(sp)) << " parameters)";
  if (sp.arch == "vit") os << ", micro-batch " << ps.micro_batch << " images";
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
  row("peak at", [](const StrategyPlan& p) { return p.mem.peak_at; });
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
       << " over each host's link per step): the least communication among the strategies"
       << " that fit" << (rc ? "; none fits without recomputation" : " without recomputation") << "\n";
  }
  return os.str();
}

}  // namespace shardtrain::train
