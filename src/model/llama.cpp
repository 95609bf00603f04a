// Llama: Llama-style decoder with HF LlamaForCausalLM names, see llama.h.
#include "shardtrain/model/llama.h"
#include "shardtrain/model/bf16_gemm.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "shardtrain/util/error.h"

namespace shardtrain::model {

at::Tensor rope_inv_freq(const ModelSpec& s, c10::Device device) {
  // transformers' _compute_default_rope_parameters / _compute_linear_scaling_rope_parameters /
  // _compute_llama3_parameters (modeling_rope_utils.py), op for op in fp32, so the tables are
  // the same bits as theirs.
  // Computed on the CPU (a few numbers) and moved: the same bits on every device, meta included.
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  const int64_t hd = head_dim_of(s);
  at::Tensor inv_freq =
      at::pow(s.rope_theta, at::arange(0, hd, 2, opts.dtype(at::kLong)).to(at::kFloat) / static_cast<double>(hd))
          .reciprocal();
  if (s.rope_scaling == "linear") return (inv_freq / s.rope_factor).to(device);
  if (s.rope_scaling != "llama3") return inv_freq.to(device);
  const double factor = s.rope_factor, low = s.rope_low_freq_factor, high = s.rope_high_freq_factor;
  const double old_len = static_cast<double>(s.rope_original_max_positions);
  const double low_freq_wavelen = old_len / low, high_freq_wavelen = old_len / high;
  // Python's `scalar / tensor` is reciprocal(tensor) * scalar.
  const at::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
  // Wavelengths above low_freq_wavelen: divided by factor; below high_freq_wavelen: kept;
  // in between: interpolated with a smooth factor.
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  const at::Tensor smooth = (wavelen.reciprocal() * old_len - low) / (high - low);
  const at::Tensor smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  const at::Tensor medium = at::logical_not(wavelen < high_freq_wavelen) * at::logical_not(wavelen > low_freq_wavelen);
  return at::where(medium, smoothed, scaled).to(device);
}

RotaryTables rotary_tables(int64_t seq_len, const at::Tensor& inv_freq) {
  const auto opts = inv_freq.options();
  at::Tensor freqs = at::arange(seq_len, opts).unsqueeze(1) * inv_freq.unsqueeze(0);  // [T, hd/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

RotaryTables rotary_at(const RotaryTables& rope, const at::Tensor& positions) {
  const int64_t b = positions.size(0), t = positions.size(1), hd = rope.cos.size(-1);
  if (rope.cos.is_meta())  // libtorch 1.13 has no meta index_select: the shapes are what matter
    return {rope.cos.view({1, 1, t, hd}).expand({b, 1, t, hd}), rope.sin.view({1, 1, t, hd}).expand({b, 1, t, hd})};
  const at::Tensor flat = positions.reshape({-1}).to(rope.cos.device());
  return {rope.cos.index_select(0, flat).view({b, 1, t, hd}), rope.sin.index_select(0, flat).view({b, 1, t, hd})};
}

at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& rope) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  const auto dtype = x.scalar_type();
  return x * rope.cos.to(dtype) + rotated * rope.sin.to(dtype);
}

LlamaAttention::LlamaAttention(const ModelSpec& spec, c10::Device device)
    : n_heads_(spec.n_heads), n_kv_heads_(spec.n_kv_heads), dropout_(spec.dropout) {
  const int64_t d = spec.d_model, hd = head_dim_of(spec);
  // Llama's attention_bias: q, k, v and o; Qwen2: q, k and v only.
  const bool qkv_bias = spec.attention_bias || spec.qkv_bias;
  q_proj_ = register_module("q_proj", std::make_shared<Linear>(d, n_heads_ * hd, qkv_bias, device));
  k_proj_ = register_module("k_proj", std::make_shared<Linear>(d, n_kv_heads_ * hd, qkv_bias, device));
  v_proj_ = register_module("v_proj", std::make_shared<Linear>(d, n_kv_heads_ * hd, qkv_bias, device));
  o_proj_ = register_module("o_proj", std::make_shared<Linear>(n_heads_ * hd, d, spec.attention_bias, device));
}

namespace {
// HF repeat_kv: [B, KV, T, hd] -> [B, KV*rep, T, hd], query head h reads kv head h / rep.
at::Tensor repeat_kv(const at::Tensor& x, int64_t rep) {
  if (rep == 1) return x;
  const int64_t b = x.size(0), kv = x.size(1), t = x.size(2), hd = x.size(3);
  return x.unsqueeze(2).expand({b, kv, rep, t, hd}).reshape({b, kv * rep, t, hd});
}
}  // namespace

at::Tensor LlamaAttention::forward(const at::Tensor& x, const RotaryTables& rope, const Rows& rows) {
  at::Tensor q = apply_rotary(split_heads(q_proj_->forward(x), n_heads_), rope);
  at::Tensor k = apply_rotary(split_heads(k_proj_->forward(x), n_kv_heads_), rope);
  at::Tensor v = split_heads(v_proj_->forward(x), n_kv_heads_);
  const int64_t rep = n_heads_ / n_kv_heads_;
  at::Tensor y = row_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), rows, dropout_, is_training());
  return o_proj_->forward(merge_heads(y));
}

LlamaMLP::LlamaMLP(const ModelSpec& spec, c10::Device device) {
  const bool bias = spec.mlp_bias;
  gate_proj_ = register_module("gate_proj", std::make_shared<Linear>(spec.d_model, spec.d_ff, bias, device));
  up_proj_ = register_module("up_proj", std::make_shared<Linear>(spec.d_model, spec.d_ff, bias, device));
  down_proj_ = register_module("down_proj", std::make_shared<Linear>(spec.d_ff, spec.d_model, bias, device));
}

at::Tensor LlamaMLP::forward(const at::Tensor& x) {
  return down_proj_->forward(at::silu(gate_proj_->forward(x)) * up_proj_->forward(x));
}

LlamaDecoderLayer::LlamaDecoderLayer(const ModelSpec& spec, c10::Device device)
    : torch::nn::Module(kTypeName), dropout_(spec.dropout) {
  input_layernorm_ = register_module("input_layernorm", std::make_shared<RMSNorm>(spec.d_model, spec.norm_eps, device));
  self_attn_ = register_module("self_attn", std::make_shared<LlamaAttention>(spec, device));
  post_attention_layernorm_ = register_module(
      "post_attention_layernorm", std::make_shared<RMSNorm>(spec.d_model, spec.norm_eps, device));
  mlp_ = register_module("mlp", std::make_shared<LlamaMLP>(spec, device));
}

at::Tensor LlamaDecoderLayer::forward(const at::Tensor& input, const RotaryTables& rope, const Rows& rows) {
  // The body owns copies of what it uses besides `this` (the rotary tables, the rows): the
  // engine may re-run it in backward (recomputation), after this call has returned.
  return hooked(input, [this, rope, rows](const at::Tensor& x) {
    const bool train = is_training();
    at::Tensor h =
        x + maybe_dropout(self_attn_->forward(input_layernorm_->forward(x), rope, rows), dropout_, train);
    return h + maybe_dropout(mlp_->forward(post_attention_layernorm_->forward(h)), dropout_, train);
  });
}

LlamaBackbone::LlamaBackbone(const ModelSpec& spec, c10::Device device) {
  embed_tokens = register_module("embed_tokens", std::make_shared<Embedding>(spec.vocab_size, spec.d_model, device));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < spec.n_layers; ++i) {
    blocks.push_back(std::make_shared<LlamaDecoderLayer>(spec, device));
    layers->push_back(blocks.back());
  }
  norm = register_module("norm", std::make_shared<RMSNorm>(spec.d_model, spec.norm_eps, device));
}

Llama::Llama(const ModelSpec& spec, c10::Device device) : Model(resolve_spec(spec)) {
  model_ = register_module("model", std::make_shared<LlamaBackbone>(spec_, device));
  if (!spec_.tie_embeddings)
    lm_head_ = register_module("lm_head", std::make_shared<Linear>(spec_.d_model, spec_.vocab_size, false, device));
}

at::Tensor Llama::forward(const at::Tensor& tokens, const Rows& rows) {
  return hooked(tokens, [this, rows](const at::Tensor& input) {
    ST_USER_CHECK(input.dim() == 2, "llama: expected token ids [B, T], got ", input.sizes());
    const int64_t t = input.size(1);
    ST_USER_CHECK(t <= spec_.seq_len, "llama: sequence of ", t, " tokens exceeds seq_len ", spec_.seq_len);
    // Recomputed per call on the input's device: O(T*hd), never a (meta) buffer.
    // Packed rows: each token's row of the same tables (position p of a row = row p alone).
    RotaryTables rope = rotary_tables(t, rope_inv_freq(spec_, input.device()));
    if (!rows.empty()) rope = rotary_at(rope, rows.positions);
    at::Tensor x = maybe_dropout(model_->embed_tokens->forward(input), spec_.dropout, is_training());
    for (const auto& block : model_->blocks) x = block->forward(x, rope, rows);
    x = model_->norm->forward(x);
    return lm_head_ ? lm_head_->forward(x) : model::linear(x, model_->embed_tokens->weight());
  });
}

ParamInit Llama::init_for(const std::string& name) const {
  using K = ParamInit::Kind;
  // HF LlamaPreTrainedModel: normal(0, initializer_range=0.02) for every matrix, ones for norms.
  if (name.find("norm.weight") != std::string::npos) return {K::Ones, 0.0};
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) return {K::Zeros, 0.0};
  ST_CHECK(name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0,
           "llama has no parameter named ", name);
  return {K::Normal, 0.02};
}

int64_t Llama::parameter_count(const ModelSpec& s) {
  const int64_t d = s.d_model, hd = head_dim_of(s), f = s.d_ff;
  const int64_t attn = d * s.n_heads * hd * 2 + d * s.n_kv_heads * hd * 2 +
                       (s.attention_bias || s.qkv_bias ? (s.n_heads + 2 * s.n_kv_heads) * hd : 0) +
                       (s.attention_bias ? d : 0);
  const int64_t per_block = attn + 3 * d * f + (s.mlp_bias ? 2 * f + d : 0) + 2 * d;
  return s.vocab_size * d * (s.tie_embeddings ? 1 : 2) + s.n_layers * per_block + d;
}

double Llama::train_flops_per_token(int64_t seq_len) const {
  // The weights (weight_flops_per_token: 6N without a fine-tune) but the embedding lookup; the LM
  // head matrix (tied or not) is counted once. Attention scores and the weighted sum: 2 x 2 x T x
  // (heads x head_dim) per token and layer, x3 for training.
  const std::vector<std::string> lookups =
      spec_.tie_embeddings ? std::vector<std::string>{} : std::vector<std::string>{"model.embed_tokens.weight"};
  return weight_flops_per_token(lookups) +
         12.0 * static_cast<double>(spec_.n_layers * spec_.n_heads * head_dim_of(spec_) * seq_len);
}

namespace {
// What trains in one decoder layer (its two norms, seven linears).
struct LlamaBlockTraining {
  bool norm1 = true, norm2 = true;
  LinearTraining q, k, v, o, gate, up, down;
};

LlamaBlockTraining block_training(const torch::nn::Module& blk, double lora_dropout) {
  LlamaBlockTraining t;
  t.norm1 = param_trains(blk, "input_layernorm.weight");
  t.norm2 = param_trains(blk, "post_attention_layernorm.weight");
  t.q = linear_training(blk, "self_attn.q_proj", lora_dropout);
  t.k = linear_training(blk, "self_attn.k_proj", lora_dropout);
  t.v = linear_training(blk, "self_attn.v_proj", lora_dropout);
  t.o = linear_training(blk, "self_attn.o_proj", lora_dropout);
  t.gate = linear_training(blk, "mlp.gate_proj", lora_dropout);
  t.up = linear_training(blk, "mlp.up_proj", lora_dropout);
  t.down = linear_training(blk, "mlp.down_proj", lora_dropout);
  return t;
}

struct LlamaBlockCost {
  BlockBytes bytes;
  bool rotary_used = false;  // q or k needs a gradient (mul then saves the rotary tables)
  bool out_rg = false;
};

// One decoder layer: x (width d) -> RMSNorm -> q, k, v (rotary on q and k: under mixed precision
// each use of the fp32 tables makes a b-byte copy of cos and sin that mul saves) -> attention
// (heads x head_dim wide: xa) -> o_proj -> residual h -> RMSNorm -> SwiGLU (silu saves gate's
// output, the product saves silu(gate) and up) -> down_proj -> residual.
LlamaBlockCost block_costs(const ActivationShape& x, const ActivationShape& xa, const LlamaBlockTraining& t, bool in_rg,
                           bool dropout) {
  const int64_t b = x.b, nd = x.nd(), nf = x.nf();
  const NormCost n1 = rms_norm_cost(x, in_rg, t.norm1);
  const LinearCost q = linear_cost(x, x.d, t.q, n1.out_rg), k = linear_cost(x, x.d, t.k, n1.out_rg),
                   v = linear_cost(x, x.d, t.v, n1.out_rg);
  const int64_t xn = q.saves_input || k.saves_input || v.saves_input ? b * nd : 0;
  const int64_t rotary = x.mixed ? ((q.out_rg ? 2 : 0) + (k.out_rg ? 2 : 0)) * b * x.T * x.hd : 0;
  const AttentionCost at = attention_cost(xa, q.out_rg, k.out_rg, v.out_rg);
  const LinearCost o = linear_cost(xa, xa.d, t.o, at.out_rg);
  const int64_t merged = o.saves_input && !at.output_saved ? b * xa.nd() : 0;
  const bool h_rg = in_rg || o.out_rg;
  const NormCost n2 = rms_norm_cost(x, h_rg, t.norm2);
  const LinearCost gate = linear_cost(x, x.d, t.gate, n2.out_rg), up = linear_cost(x, x.d, t.up, n2.out_rg);
  const int64_t xn2 = gate.saves_input || up.saves_input ? b * nd : 0;
  const bool prod_rg = gate.out_rg || up.out_rg;
  const int64_t swiglu = (gate.out_rg ? 2 * b * nf : 0) + (up.out_rg ? b * nf : 0);  // gate, up; silu(gate)
  const LinearCost down = linear_cost(x, x.f, t.down, prod_rg);
  const int64_t prod = down.saves_input ? b * nf : 0;
  const bool out_rg = h_rg || down.out_rg;
  // A norm that saves its input tensor itself (fp32) keeps the residual h, and the next one this
  // block's output, counted here.
  const int64_t h_saved = n2.keeps_input ? b * nd : 0;
  const int64_t out_saved = rms_norm_cost(x, out_rg, false).keeps_input ? b * nd : 0;
  const bool s_rg = q.out_rg || k.out_rg;
  const int64_t drop = dropout ? dropout_saved(x, o.out_rg, down.out_rg, s_rg, v.out_rg) : 0;
  const int64_t attn_part = n1.saved + xn + q.saved + k.saved + v.saved + rotary + at.saved + merged + o.saved;
  const int64_t mlp_part = h_saved + n2.saved + xn2 + gate.saved + up.saved + swiglu + prod + down.saved;
  LlamaBlockCost c;
  c.rotary_used = s_rg;
  c.out_rg = out_rg;
  c.bytes.saved = attn_part + mlp_part + out_saved + drop;
  c.bytes.out_saved = out_saved;
  c.bytes.backward = out_rg;
  // Backward, relative to its start. down_proj: its weight's gradient [d, f] (with the GEMM
  // workspace) and the input gradient [n, f]; with LoRA the branch's input gradient came first
  // (the base's is added to it in place, as measured here), while the branch's saved set (A x,
  // dropout's copies) and (a frozen base's) input are released. Inside the branch: the scaled output
  // gradient (with lora_B's weight-gradient workspace), then the input gradient.
  constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
  const bool lora = down.lora_low > 0;
  const int64_t lora_in = lora ? (prod_rg ? b * nf : 0) - down.saved - (t.down.weight ? 0 : prod) : 0;
  const int64_t down_m =
      (t.down.weight ? b * x.f * x.d + gemm_workspace_bytes(x, x.d) : 0) + (prod_rg ? b * nf : 0) + lora_in;
  const int64_t lora_m = lora ? std::max(b * nd + gemm_workspace_bytes(x, x.d), prod_rg ? b * nf : 0) : kNone;
  // The SwiGLU product's backward: its gradient and the ones it makes (silu(gate)'s, up's); the
  // product itself, if down_proj saved it, and LoRA's A x are released by then, with dropout the
  // MLP branch's noise, and the block's incoming gradient unless the residual h needs it.
  const int64_t grad_out = b * nd;
  const int64_t prod_m = prod_rg ? b * nf + (gate.out_rg ? b * nf : 0) + (up.out_rg ? b * nf : 0) - prod - down.saved -
                                       (dropout && down.out_rg ? b * nd : 0) - (h_rg ? 0 : grad_out)
                                 : kNone;
  // Attention peaks in its own backward after the MLP half, o_proj's saved set and (explicit)
  // the merged heads, v' and the b-byte probabilities are released, and h's gradient unless the
  // block's input needs it.
  const int64_t attn_m = at.bwd > 0 ? -(mlp_part + merged + o.saved + at.released + drop) + at.held + at.bwd -
                                          (in_rg ? 0 : grad_out)
                                    : kNone;
  c.bytes.bwd_work = std::max({down_m, lora_m, prod_m, attn_m});
  return c;
}
}  // namespace

// Per block as block_costs (what trains read from the model: requires_grad, LoRA's adapters);
// the root adds the embedding output (kept by the first norm in fp32 when it needs a gradient),
// the fp32 rotary tables and the LM head.
ActivationBytes Llama::activation_bytes(const CostQuery& q) const {
  const ModelSpec& s = spec_;
  ActivationShape x = activation_shape(q, s.d_model, s.d_ff, s.n_heads, s.seq_len, /*causal=*/true,
                                       "model.layers.0.input_layernorm.weight");
  x.hd = head_dim_of(s);
  // The attention tensors are heads x head_dim wide, which an explicit head_dim makes differ from d.
  ActivationShape xa = x;
  xa.d = s.n_heads * head_dim_of(s);
  const int64_t b = x.b, nd = x.nd();
  const bool dropout = s.dropout > 0;
  const bool embed_rg = param_trains(*this, "model.embed_tokens.weight");
  ActivationBytes a;
  a.embedding_trains = embed_rg;
  a.grad_in = b * nd;
  a.block_io = b * nd;
  bool in_rg = embed_rg, rotary_used = false;
  for (const auto& blk : model_->blocks) {
    const LlamaBlockCost c = block_costs(x, xa, block_training(*blk, s.finetune.lora.dropout), in_rg, dropout);
    a.blocks.push_back(c.bytes);
    rotary_used = rotary_used || c.rotary_used;
    in_rg = c.out_rg;
  }
  // The final norm, and its output saved by the head for its weight's gradient.
  const bool norm_trains = param_trains(*this, "model.norm.weight");
  const NormCost nf = rms_norm_cost(x, in_rg, norm_trains);
  a.final_norm_bwd = in_rg ? nf.saved + b * nd + rms_norm_backward_bytes(x, norm_trains) : 0;
  const bool head_trains = param_trains(*this, s.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  a.head_saved = nf.saved + (head_trains ? b * nd : 0);
  a.last_out_kept = nf.keeps_input ? b * nd : 0;
  // Embedding output (kept by the first norm when fp32 and it needs a gradient) and the fp32
  // rotary tables (saved by mul in fp32 when q or k needs a gradient; captured by every block
  // body under recomputation).
  const int64_t rope = 2 * 4 * x.T * x.hd;
  a.embed_saved = (!x.mixed && embed_rg ? b * nd : 0) + (!x.mixed && rotary_used ? rope : 0);
  a.embed_saved_rc = rope;
  if (dropout && embed_rg) {  // the embedding dropout's noise
    a.embed_saved += b * nd;
    a.embed_saved_rc += b * nd;
  }
  lm_head_costs(x, s.vocab_size, s.tie_embeddings, head_trains, embed_rg, nf.out_rg, a);
  return a;
}

}  // namespace shardtrain::model
