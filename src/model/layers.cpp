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
// and rstd, and the b-byte output (saved by the next projection); otherwise it saves its input
// itself, mean, rstd and the output.
int64_t layer_norm_saved(const ActivationShape& x) {
  const int64_t n = x.n(), nd = x.nd();
  return x.norm32 ? 4 * nd + 8 * n + x.b * nd : x.b * nd + 8 * n;
}
bool layer_norm_keeps_input(const ActivationShape& x) { return !x.norm32; }

RMSNorm::RMSNorm(int64_t dim, double eps, c10::Device device) : eps_(eps) {
  add_param(*this, "weight", {dim}, device);
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean({-1}, /*keepdim=*/true) + eps_);
  return h.to(x.scalar_type()) * param("weight").to(x.scalar_type());
}

// h = x.to(fp32); h*rsqrt(mean(h^2)+eps) -> .to(b) * weight.to(b). Saves h (a copy unless
// fp32), pow(h, 2) (mean saves its input), the normalised tensor (b), the output (b; saved by the
// projections), rsqrt [n, 1] and, with fp32 weights under mixed precision, the weight's b-byte copy.
int64_t rms_norm_saved(const ActivationShape& x) {
  const int64_t n = x.n(), nd = x.nd();
  return x.mixed ? 8 * nd + 2 * x.b * nd + 4 * n + (x.norm32 ? x.b * x.d : 0) : 12 * nd + 4 * n;
}
bool rms_norm_keeps_input(const ActivationShape& x) { return !x.mixed; }

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

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                     double dropout, bool training) {
  // On CUDA with libtorch 2.x: the fused kernels (flash / memory-efficient), which never build
  // the [T, S] score matrix. CPU keeps the explicit form below, so CPU results do not depend on
  // the libtorch version.
  if (torch_compat::has_fused_attention() && q.is_cuda() && (!causal || q.size(-2) == k.size(-2))) {
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

// Softmax runs in fp32 (its output is saved); under mixed precision bmm saves a b-byte copy of
// the probabilities; the causal mask is a bool [T, T] saved by masked_fill.
int64_t attention_saved(const ActivationShape& x) {
  const int64_t probs = x.mixed ? (4 + x.b) * x.attn() : 4 * x.attn();
  const int64_t mask = x.causal ? x.T * x.T : 0;
  return 4 * x.b * x.nd() + probs + mask;
}
int64_t attention_probs_copy(const ActivationShape& x) { return x.mixed ? x.b * x.attn() : 0; }
int64_t softmax_backward_bytes(const ActivationShape& x) { return 8 * x.attn(); }

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
// which mul saves; the output replaces the input downstream. Per block: the noise of both
// residual branches (the branch outputs themselves are then freed), and on the attention
// probabilities the noise and the dropped-out copy that bmm now saves (fp32: next to the softmax
// output; mixed: instead of the b-byte copy). The root adds the embedding dropout's noise.
void dropout_costs(const ActivationShape& x, ActivationBytes& a) {
  const int64_t b = x.b, nd = x.nd();
  const int64_t extra = 2 * b * nd + (x.mixed ? b * x.attn() : 2 * b * x.attn());
  a.block_saved += extra;
  a.block_bwd_attn -= extra;
  a.embed_saved += b * nd;
  a.embed_saved_rc += b * nd;
}

// ---- costs shared by the architectures (costs.h) ---------------------------------------------

int64_t ActivationBytes::saved(bool recompute) const {
  if (recompute) return inputs + embed_saved_rc + blocks * block_io + last_out_kept + head_saved;
  return inputs + embed_saved + blocks * block_saved + head_saved;
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
  x.threads = q.threads;
  return x;
}

// Measured: about 673 bytes per token up to 512 tokens and 476 KB beyond when M >= 256,
// proportionally less for narrower M (more for very wide layers: 1.3 MiB at 2048 x 768). fp32
// GEMMs (MKL/OpenBLAS) allocate no tensors.
int64_t gemm_workspace_bytes(const ActivationShape& x, int64_t M) {
  if (!x.mixed) return 0;
  const int64_t n = x.n();
  const int64_t full = n <= 512 ? 673 * n : 476160;
  return static_cast<int64_t>(std::max(1, x.threads)) * full * std::min<int64_t>(M, 256) / 256;
}

bool layer_norm_block_costs(const ActivationShape& x, int64_t mlp_out_rows, ActivationBytes& a) {
  const int64_t b = x.b, nd = x.nd(), nf = x.nf();
  a.gemm_ws = gemm_workspace_bytes(x, mlp_out_rows);
  a.grad_in = b * nd;
  a.block_io = b * nd;
  const int64_t ln = layer_norm_saved(x);
  // Whether a norm saves its input tensor itself rather than an fp32 copy of it: then each
  // block's output stays alive until the next block's norm runs backward, and is counted in the
  // block that produced it.
  const bool input_kept = layer_norm_keeps_input(x);
  a.norm_saved = ln;
  // MLP: c_fc / fc1 output (saved by gelu) and gelu output (saved by c_proj / fc2).
  const int64_t mlp_saved = 2 * b * nf;
  const int64_t h_saved = input_kept ? b * nd : 0;  // the residual h, saved by the second norm
  const int64_t out_saved = input_kept ? b * nd : 0;
  a.block_saved = 2 * ln + attention_saved(x) + mlp_saved + h_saved + out_saved;
  a.block_out_saved = out_saved;
  // Backward: the MLP's second projection (input grad [n, f], weight grad [f, d], bias);
  // attention peaks in softmax backward after the MLP, the second norm, h, merged heads, v' (and
  // the b copy of the probabilities) are released, with v's gradient waiting for q's and k's.
  a.block_bwd_mlp = b * nf + b * x.f * x.d + a.gemm_ws + b * x.d;
  a.block_bwd_attn =
      -(mlp_saved + ln + h_saved + 2 * b * nd + attention_probs_copy(x)) + b * nd + softmax_backward_bytes(x);
  a.head_saved = ln;
  a.last_out_kept = input_kept ? b * nd : 0;
  return input_kept;
}

void lm_head_costs(const ActivationShape& x, int64_t V, bool tied, ActivationBytes& a) {
  const int64_t n = x.n(), b = x.b, d = x.d;
  a.inputs = 2 * 8 * n;  // token ids and targets, int64
  // Loss: fp32 logits and log-softmax (the b logits are freed when cast); backward of the
  // loss: log-softmax output, nll grad and log-softmax grad, all [n, V] fp32.
  a.head_fwd_work = 8 * n * V;
  a.head_bwd_work = 12 * n * V;
  // Head projection backward: logits grad (b), input grad and weight grad.
  a.head_bwd_mm = b * n * V + b * x.nd() + b * V * d + gemm_workspace_bytes(x, d);
  // A tied embedding's head gradient waits in autograd's input buffer until the embedding's
  // own gradient arrives at the end of backward; then both and their sum exist at once.
  a.held_grad = tied ? b * V * d : 0;
  a.embed_bwd = (tied ? 3 : 1) * b * V * d;
}

}  // namespace shardtrain::model
