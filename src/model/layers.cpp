// Layers shared by the models and the parameter-dict accessors (see layers.h).
#include "shardtrain/model/layers.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "shardtrain/model/bf16_gemm.h"
#include "shardtrain/model/costs.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/names.h"
#include "shardtrain/util/torch_compat.h"

namespace shardtrain::model {

namespace {
// Module::parameters_ is protected; a pointer to it formed inside a derived class is a
// `ParamDict Module::*` and may be applied to any Module (standard C++, no casts).
struct DictAccess : torch::nn::Module {
  static ParamDict torch::nn::Module::*member() { return &DictAccess::parameters_; }
};
}  // namespace

ParamDict& parameter_dict(torch::nn::Module& module) { return module.*DictAccess::member(); }
const ParamDict& parameter_dict(const torch::nn::Module& module) {
  return module.*DictAccess::member();
}

const at::Tensor& dict_param(const torch::nn::Module& module, const std::string& name) {
  const at::Tensor* found = parameter_dict(module).find(name);
  ST_CHECK(found != nullptr, "module ", module.name(), " has no parameter '", name, "'");
  return *found;
}

at::Tensor& add_param(torch::nn::Module& module, const std::string& name,
                      std::vector<int64_t> shape, c10::Device device) {
  return module.register_parameter(
      name, at::empty(shape, at::TensorOptions().device(device).dtype(at::kFloat)));
}

namespace {
// One LoRA factor: a module holding only "weight" (PEFT's lora_A / lora_B are bias-free nn.Linear).
struct LoraFactor : ParamModule {
  LoraFactor(int64_t rows, int64_t cols, c10::Device device) { add_param(*this, "weight", {rows, cols}, device); }
};
}  // namespace

void LoraBranch::attach(torch::nn::Module& layer, int64_t in, int64_t out, int64_t rank, double scale, double dropout,
                        c10::Device device) {
  ST_CHECK(!on(), "LoRA attached twice to ", layer.name());
  a_ = layer.register_module("lora_A", std::make_shared<LoraFactor>(rank, in, device));
  b_ = layer.register_module("lora_B", std::make_shared<LoraFactor>(out, rank, device));
  scale_ = scale;
  dropout_ = dropout;
}

at::Tensor LoraBranch::add_to(const at::Tensor& y, const at::Tensor& x, bool training) const {
  // PEFT: result + lora_B(lora_A(dropout(x))) * scaling, in that order.
  const at::Tensor low = model::linear(maybe_dropout(x, dropout_, training), dict_param(*a_, "weight"));
  return y + model::linear(low, dict_param(*b_, "weight")) * scale_;
}

void LinearLayer::add_lora(int64_t rank, double scale, double dropout) {
  lora_.attach(*this, in_, out_, rank, scale, dropout, param("weight").device());
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, c10::Device device)
    : LinearLayer(in_features, out_features), has_bias_(bias) {
  add_param(*this, "weight", {out_features, in_features}, device);
  if (bias) add_param(*this, "bias", {out_features}, device);
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  at::Tensor y = has_bias_ ? model::linear(x, param("weight"), param("bias")) : model::linear(x, param("weight"));
  return with_lora(y, x);
}

Conv1D::Conv1D(int64_t in_features, int64_t out_features, c10::Device device) : LinearLayer(in_features, out_features) {
  add_param(*this, "weight", {in_features, out_features}, device);
  add_param(*this, "bias", {out_features}, device);
}

at::Tensor Conv1D::forward(const at::Tensor& x) const {
  const at::Tensor& w = param("weight");
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = w.size(1);
  return with_lora(model::addmm(param("bias"), x.reshape({-1, w.size(0)}), w).view(out_shape), x);
}

LayerNorm::LayerNorm(int64_t dim, double eps, c10::Device device) : dim_(dim), eps_(eps) {
  add_param(*this, "weight", {dim}, device);
  add_param(*this, "bias", {dim}, device);
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const {
  const at::Tensor& w = param("weight");
  const at::Tensor& b = param("bias");
  if (x.is_meta() || w.is_meta()) {
    // libtorch 1.13 lowers layer_norm on meta to batch_norm, which has no meta kernel;
    // the elementwise formula has the same shapes and autograd graph.
    at::Tensor centered = x - x.mean({-1}, /*keepdim=*/true);
    at::Tensor var = centered.pow(2).mean({-1}, /*keepdim=*/true);
    return centered * at::rsqrt(var + eps_) * w.to(x.scalar_type()) + b.to(x.scalar_type());
  }
  if (w.scalar_type() == x.scalar_type()) return at::layer_norm(x, {dim_}, w, b, eps_);
  return at::layer_norm(x.to(w.scalar_type()), {dim_}, w, b, eps_).to(x.scalar_type());
}

// With fp32 weights under mixed precision, layer_norm(x.to(fp32)).to(b) saves the fp32 copy, mean
// and rstd; otherwise it saves its input itself, mean and rstd. native_layer_norm saves them all
// when any of input, weight and bias needs a gradient (one formula computes the three).
NormCost layer_norm_cost(const ActivationShape& x, bool in_rg, bool trains) {
  NormCost c;
  const bool any = in_rg || trains;
  c.saved = any ? (x.norm32 ? 4 * x.nd() : 0) + 8 * x.n() : 0;
  c.keeps_input = any && !x.norm32;
  c.out_rg = any;
  return c;
}

// Measured with the counting allocator: the input gradient, one fp32 [n, d] and the fp32 copy's
// under mixed precision.
int64_t layer_norm_backward_bytes(const ActivationShape& x, bool trains) {
  return (x.norm32 ? 8 * x.nd() : x.b * x.nd()) + (trains ? 16 * x.d : 0);
}

RMSNorm::RMSNorm(int64_t dim, double eps, c10::Device device) : eps_(eps) {
  add_param(*this, "weight", {dim}, device);
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean({-1}, /*keepdim=*/true) + eps_);
  return h.to(x.scalar_type()) * param("weight").to(x.scalar_type());
}

// h = x.to(fp32); h*rsqrt(mean(h^2)+eps) -> .to(b) * weight.to(b). With the input needing a
// gradient it saves h (a copy unless fp32), pow(h, 2) (mean saves its input), rsqrt [n, 1] and,
// with fp32 weights under mixed precision, the weight's b-byte copy; the normalised tensor (b)
// only for the weight's gradient.
NormCost rms_norm_cost(const ActivationShape& x, bool in_rg, bool weight_trains) {
  const int64_t n = x.n(), nd = x.nd();
  NormCost c;
  if (x.mixed)
    c.saved = (in_rg ? 8 * nd + 4 * n + (x.norm32 ? x.b * x.d : 0) : 0) + (weight_trains ? x.b * nd : 0);
  else
    c.saved = (in_rg ? 4 * nd + 4 * n : 0) + (weight_trains ? 4 * nd : 0);
  c.keeps_input = !x.mixed && in_rg;
  c.out_rg = in_rg || weight_trains;
  return c;
}

// Measured with the counting allocator (any n, d): fp32 [n, d] temporaries of the products' and
// the casts' gradients, fewer when the normalised tensor is saved for the weight's gradient.
int64_t rms_norm_backward_bytes(const ActivationShape& x, bool weight_trains) {
  const int64_t n = x.n(), nd = x.nd();
  if (x.mixed) return (weight_trains ? 14 : 16) * nd - 4 * n - x.b * x.d;
  return (weight_trains ? 12 : 16) * nd - 4 * n;
}

Embedding::Embedding(int64_t num, int64_t dim, c10::Device device) {
  add_param(*this, "weight", {num, dim}, device);
}

at::Tensor Embedding::forward(const at::Tensor& ids) const {
  const at::Tensor& w = weight();
  if (w.is_meta() || ids.is_meta()) {
    // libtorch 1.13 has no meta index_select; a lookup is one_hot(ids) @ weight, which
    // gives the same shapes and a [num, dim] gradient, and costs nothing on meta.
    std::vector<int64_t> one_hot_shape(ids.sizes().begin(), ids.sizes().end());
    one_hot_shape.push_back(w.size(0));
    return at::matmul(at::empty(one_hot_shape, w.options().device(at::kMeta)), w.to(at::kMeta));
  }
  return at::embedding(w, ids);
}

bool attention_is_fused(bool cuda) { return cuda && torch_compat::has_fused_attention(); }

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                     double dropout, bool training) {
  // On CUDA with libtorch 2.x: the fused kernels (flash / memory-efficient), which never build
  // the [T, S] score matrix. CPU keeps the explicit form below, so CPU results do not depend on
  // the libtorch version.
  if (attention_is_fused(q.is_cuda()) && (!causal || q.size(-2) == k.size(-2))) {
    at::Tensor y = torch_compat::fused_attention(q, k, v, causal, training ? dropout : 0.0);
    if (y.defined()) return y;
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  if (causal) {
    const int64_t t = q.size(-2), s = k.size(-2);
    // Query i sees keys j <= i + (s - t): the usual lower triangle when s == t.
    at::Tensor future = at::ones({t, s}, q.options().dtype(at::kBool)).triu(s - t + 1);
    scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  }
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  probs = maybe_dropout(probs, dropout, training);
  return at::matmul(probs, v);
}

at::Tensor row_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Rows& rows,
                         double dropout, bool training) {
  if (rows.empty()) return attention(q, k, v, /*causal=*/true, dropout, training);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), hd = q.size(3);
  ST_CHECK(k.size(2) == T && rows.cu_seqlens.front() == 0 && rows.cu_seqlens.back() == B * T,
           "row_attention: rows over ", rows.cu_seqlens.back(), " tokens for a batch of ", B, " x ", T);
  if (attention_is_fused(q.is_cuda())) {
    // One fused call over the windows: a block-diagonal causal mask from the rows' ids.
    std::vector<int64_t> id(static_cast<size_t>(B * T));
    for (size_t r = 0; r + 1 < rows.cu_seqlens.size(); ++r)
      for (int64_t i = rows.cu_seqlens[r]; i < rows.cu_seqlens[r + 1]; ++i) id[i] = static_cast<int64_t>(r);
    const at::Tensor ids = at::tensor(id, at::kLong).view({B, T}).to(q.device());
    const at::Tensor mask =
        ids.unsqueeze(2).eq(ids.unsqueeze(1)).logical_and(at::ones({T, T}, ids.options().dtype(at::kBool)).tril());
    at::Tensor y = torch_compat::fused_attention_masked(q, k, v, mask.unsqueeze(1), training ? dropout : 0.0);
    if (y.defined()) return y;
  }
  // Each row's own causal block: its [L, L] scores only. Rows are taken in order over the
  // flattened windows, so their outputs concatenate to [1, H, B x T, hd].
  std::vector<at::Tensor> out;
  out.reserve(rows.cu_seqlens.size() - 1);
  for (size_t r = 0; r + 1 < rows.cu_seqlens.size(); ++r) {
    const int64_t s = rows.cu_seqlens[r], len = rows.cu_seqlens[r + 1] - s, b = s / T, t0 = s % T;
    auto part = [&](const at::Tensor& x) { return x.narrow(0, b, 1).narrow(2, t0, len); };
    out.push_back(attention(part(q), part(k), part(v), /*causal=*/true, dropout, training));
  }
  return at::cat(out, 2).view({H, B, T, hd}).transpose(0, 1);
}

// Explicit: scores = q' k'^T (bmm saves q' for k's gradient and k' for q's), the causal mask
// (masked_fill saves it), softmax in fp32 (saves its output), under mixed precision a b-byte copy
// of the probabilities (saved by bmm for v's gradient; in fp32 the softmax output itself), and v'
// (saved for the probabilities' gradient). Its backward peaks in softmax backward (fp32 gradient
// in and out), with the gradient of v' waiting for q's and k's, and the b-byte probabilities and
// v' released. Fused (at::scaled_dot_product_attention, flash / memory-efficient): q, k, v, the
// output and the fp32 logsumexp per head and row, all saved when any input needs a gradient; its
// backward holds the output's gradient, dq, dk, dv, the fp32 dq accumulator and the fp32 row sums
// (from the kernels' sources; not measured here: no GPU with libtorch >= 2 on this machine).
AttentionCost attention_cost(const ActivationShape& x, bool q_rg, bool k_rg, bool v_rg) {
  const int64_t b = x.b, nd = x.nd(), attn = x.attn(), rows = x.B * x.H * x.T;
  AttentionCost c;
  if (x.fused) {
    const bool any = q_rg || k_rg || v_rg;
    c.out_rg = any;
    c.output_saved = any;
    c.saved = any ? 4 * b * nd + 4 * rows : 0;
    c.bwd = any ? 4 * b * nd + 4 * nd + 4 * rows : 0;
    return c;
  }
  const bool s_rg = q_rg || k_rg;
  c.out_rg = s_rg || v_rg;
  c.saved = (k_rg ? b * nd : 0) + (q_rg ? b * nd : 0) + (s_rg ? 4 * attn + (x.causal ? x.causal_mask() : 0) + b * nd : 0) +
            (v_rg ? (x.mixed ? b * attn : (s_rg ? 0 : 4 * attn)) : 0);
  c.released = (s_rg ? b * nd : 0) + (x.mixed && v_rg ? b * attn : 0);
  c.held = v_rg ? b * nd : 0;
  c.bwd = s_rg ? 8 * attn : 0;
  return c;
}

at::Tensor split_heads(const at::Tensor& x, int64_t n_heads) {
  const int64_t b = x.size(0), t = x.size(1), width = x.size(2);
  return x.view({b, t, n_heads, width / n_heads}).transpose(1, 2);
}

at::Tensor merge_heads(const at::Tensor& x) {
  const int64_t b = x.size(0), h = x.size(1), t = x.size(2), hd = x.size(3);
  return x.transpose(1, 2).reshape({b, t, h * hd});
}

at::Tensor maybe_dropout(const at::Tensor& x, double p, bool training) {
  if (!training || p <= 0.0) return x;
  return at::dropout(x, p, /*train=*/true);
}

// Dropout (training mode) is input * noise with a noise tensor of the input's size and dtype,
// which mul saves when the input needs a gradient; the output replaces the input downstream. Per
// block: the noise of both residual branches (the branch outputs themselves are then freed), and
// on the explicit attention's probabilities the noise and the dropped-out copy that bmm now saves
// (fp32: next to the softmax output; mixed: instead of the b-byte copy). The fused kernels drop
// out inside (no tensor).
int64_t dropout_saved(const ActivationShape& x, bool attn_branch_rg, bool mlp_branch_rg, bool scores_rg, bool v_rg) {
  const int64_t b = x.b, nd = x.nd(), attn = x.attn();
  int64_t s = (attn_branch_rg ? b * nd : 0) + (mlp_branch_rg ? b * nd : 0);
  if (!x.fused) s += (scores_rg ? b * attn : 0) + (!x.mixed && scores_rg && v_rg ? b * attn : 0);
  return s;
}

// ---- costs shared by the architectures (costs.h) ---------------------------------------------

int64_t ActivationBytes::saved(bool recompute) const {
  int64_t s = inputs + (recompute ? embed_saved_rc + last_out_kept : embed_saved) + head_saved;
  for (const BlockBytes& blk : blocks) s += recompute ? (blk.backward ? block_io : 0) : blk.saved;
  return s;
}

ActivationShape activation_shape(const CostQuery& q, int64_t d, int64_t f, int64_t heads, int64_t T, bool causal,
                                 const std::string& block_norm_param) {
  ActivationShape x;
  x.B = q.micro_batch;
  x.T = T;
  x.d = d;
  x.f = f;
  x.H = heads;
  x.hd = d / heads;
  x.b = static_cast<int64_t>(c10::elementSize(q.compute_dtype));
  x.mixed = q.compute_dtype != at::kFloat;
  x.norm32 = x.mixed && matches_any(block_norm_param, q.keep_fp32);
  x.causal = causal;
  x.fused = q.fused_attention;
  x.span = q.attention_span;
  x.cuda = q.cuda;
  x.threads = q.threads;
  return x;
}

// Measured: about 673 bytes per token up to 512 tokens and 476 KB beyond when M >= 256,
// proportionally less for narrower M (more for very wide layers: 1.3 MiB at 2048 x 768). fp32
// GEMMs (MKL/OpenBLAS) allocate no tensors, nor does cuBLAS through the caching allocator.
int64_t gemm_workspace_bytes(const ActivationShape& x, int64_t M) {
  if (!x.mixed || x.cuda) return 0;
  const int64_t n = x.n();
  const int64_t full = n <= 512 ? 673 * n : 476160;
  return static_cast<int64_t>(std::max(1, x.threads)) * full * std::min<int64_t>(M, 256) / 256;
}

bool param_trains(const torch::nn::Module& module, const std::string& name) {
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    if (p.key() == name) return p.value().requires_grad();
  return false;
}

LinearTraining linear_training(const torch::nn::Module& module, const std::string& path, double lora_dropout) {
  LinearTraining t;
  t.weight = t.bias = false;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (p.key() == path + ".weight") t.weight = p.value().requires_grad();
    if (p.key() == path + ".bias") t.bias = p.value().requires_grad();
    if (p.key() == path + ".lora_A.weight") {
      t.lora_rank = p.value().size(0);
      t.lora_dropout = lora_dropout > 0;
    }
  }
  return t;
}

// The base product saves x for its weight's gradient only; LoRA's branch y + s B(A(dropout(x)))
// saves A's input (x itself without dropout; with it the noise, when x needs a gradient, and the
// dropped-out copy) and A x [n, r] (lora_B's input); the scaling and the sum save nothing.
LinearCost linear_cost(const ActivationShape& x, int64_t in, const LinearTraining& t, bool in_rg) {
  LinearCost c;
  const bool lora = t.lora_rank > 0;
  c.saves_input = t.weight || (lora && !t.lora_dropout);
  if (lora) {
    c.lora_low = x.b * x.n() * t.lora_rank;
    c.saved = c.lora_low + (t.lora_dropout ? x.b * x.n() * in * (in_rg ? 2 : 1) : 0);
  }
  c.out_rg = in_rg || t.trains();
  return c;
}

bool layer_norm_block_out_rg(const LayerNormBlockTraining& t, bool in_rg) {
  return in_rg || t.ln1 || t.ln2 || t.attn_in.trains() || t.attn_out.trains() || t.mlp_in.trains() ||
         t.mlp_out.trains();
}

BlockBytes layer_norm_block_costs(const ActivationShape& x, int64_t mlp_out_rows, const LayerNormBlockTraining& t,
                                  bool in_rg, bool next_norm_trains, bool dropout) {
  const int64_t b = x.b, nd = x.nd(), nf = x.nf();
  // Attention half: ln_1, the qkv projection (its output split into q, k and v), attention, the
  // output projection (its input: the merged heads, a copy; fused: the kernels' own output).
  const NormCost n1 = layer_norm_cost(x, in_rg, t.ln1);
  const LinearCost qkv = linear_cost(x, x.d, t.attn_in, n1.out_rg);
  const AttentionCost at = attention_cost(x, qkv.out_rg, qkv.out_rg, qkv.out_rg);
  const LinearCost proj = linear_cost(x, x.d, t.attn_out, at.out_rg);
  const int64_t merged = proj.saves_input && !at.output_saved ? b * nd : 0;
  const bool h_rg = in_rg || proj.out_rg;
  // MLP half: ln_2 on the residual h, c_fc / fc1 (its output saved by GELU), c_proj / fc2 (its
  // input, the GELU output, saved for its weight's gradient).
  const NormCost n2 = layer_norm_cost(x, h_rg, t.ln2);
  const LinearCost fc = linear_cost(x, x.d, t.mlp_in, n2.out_rg);
  const LinearCost fc2 = linear_cost(x, x.f, t.mlp_out, fc.out_rg);
  const bool out_rg = h_rg || fc2.out_rg;
  const int64_t xn = qkv.saves_input ? b * nd : 0, xn2 = fc.saves_input ? b * nd : 0;
  const int64_t gelu_in = fc.out_rg ? b * nf : 0, gelu_out = fc2.saves_input ? b * nf : 0;
  // A norm that saves its input tensor itself keeps the residual h, and the next block's (or the
  // final) norm this block's output, counted here.
  const int64_t h_saved = n2.keeps_input ? b * nd : 0;
  const int64_t out_saved = layer_norm_cost(x, out_rg, next_norm_trains).keeps_input ? b * nd : 0;
  const int64_t drop = dropout ? dropout_saved(x, proj.out_rg, fc2.out_rg, qkv.out_rg, qkv.out_rg) : 0;
  const int64_t attn_part = n1.saved + xn + qkv.saved + at.saved + merged + proj.saved;
  const int64_t mlp_part = h_saved + n2.saved + xn2 + fc.saved + gelu_in + gelu_out + fc2.saved;
  BlockBytes blk;
  blk.saved = attn_part + mlp_part + out_saved + drop;
  blk.out_saved = out_saved;
  blk.backward = out_rg;
  // Backward, relative to its start. The MLP's second projection: its weight's gradient [f, d]
  // (with the GEMM workspace) and bias, the input gradient [n, f]; with LoRA the branch's input
  // gradient came first and the two are summed into a third tensor (measured: not in place here,
  // unlike Llama's SwiGLU product), while the branch's saved set (A x, dropout's copies) and (a
  // frozen base's) input are released. Inside the branch: the scaled output gradient (with
  // lora_B's weight-gradient workspace), then the input gradient.
  constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
  const bool lora = fc2.lora_low > 0;
  const int64_t lora_in = lora ? (fc.out_rg ? 2 * b * nf : 0) - fc2.saved - (t.mlp_out.weight ? 0 : gelu_out) : 0;
  const int64_t mlp_out = (t.mlp_out.weight ? b * x.f * x.d + gemm_workspace_bytes(x, mlp_out_rows) : 0) +
                          (t.mlp_out.bias ? b * x.d : 0) + (fc.out_rg ? b * nf : 0) + lora_in;
  const int64_t lora_m = lora ? std::max(b * nd + gemm_workspace_bytes(x, x.d), fc.out_rg ? b * nf : 0) : kNone;
  // GELU backward: its input and output gradients; the GELU output (if saved) and LoRA's A x are
  // released, with dropout the MLP branch's noise, and the block's incoming gradient unless the
  // residual h needs it.
  const int64_t grad_out = b * nd;
  const int64_t gelu = fc.out_rg ? 2 * b * nf - gelu_out - fc2.saved - (dropout && fc2.out_rg ? b * nd : 0) -
                                       (h_rg ? 0 : grad_out)
                                 : kNone;
  // Attention peaks in its own backward after the MLP half, the output projection's saved set
  // and (explicit) v' and the b-byte probabilities are released, and h's gradient unless the
  // block's input needs it.
  const int64_t attn = at.bwd > 0 ? -(mlp_part + merged + proj.saved + at.released + drop) + at.held + at.bwd -
                                        (in_rg ? 0 : grad_out)
                                  : kNone;
  blk.bwd_work = std::max({mlp_out, lora_m, gelu, attn});
  return blk;
}

void lm_head_costs(const ActivationShape& x, int64_t V, bool tied, bool head_trains, bool embedding_trains, bool in_rg,
                   ActivationBytes& a) {
  const int64_t n = x.n(), b = x.b, d = x.d;
  a.inputs = 2 * 8 * n;  // token ids and targets, int64
  // Loss: fp32 logits and log-softmax (the b logits are freed when cast); backward of the
  // loss: log-softmax output, nll grad and log-softmax grad, all [n, V] fp32.
  a.head_fwd_work = 8 * n * V;
  a.head_bwd_work = 12 * n * V;
  // Head projection backward: logits grad (b), input grad (when the blocks need it) and weight
  // grad (when the head trains).
  a.head_bwd_mm = b * n * V + (in_rg ? b * x.nd() : 0) + (head_trains ? b * V * d + gemm_workspace_bytes(x, d) : 0);
  // A tied embedding's head gradient waits in autograd's input buffer until the embedding's
  // own gradient arrives at the end of backward; then both and their sum exist at once.
  a.held_grad = tied && head_trains ? b * V * d : 0;
  a.embed_bwd = embedding_trains ? (tied && head_trains ? 3 : 1) * b * V * d : 0;
}

}  // namespace shardtrain::model
