// GPT2: Hugging Face GPT-2 (Conv1D projections, tanh GELU, tied LM head), see gpt2.h.
#include "shardtrain/model/gpt2.h"
#include "layer_norm_block_training.h"
#include "shardtrain/model/bf16_gemm.h"

#include <ATen/ATen.h>

#include <cmath>

#include "shardtrain/util/error.h"

namespace shardtrain::model {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

GPT2Attention::GPT2Attention(const ModelSpec& spec, c10::Device device)
    : n_heads_(spec.n_heads), dropout_(spec.dropout) {
  c_attn_ = register_module("c_attn", std::make_shared<Conv1D>(spec.d_model, 3 * spec.d_model, device));
  c_proj_ = register_module("c_proj", std::make_shared<Conv1D>(spec.d_model, spec.d_model, device));
}

at::Tensor GPT2Attention::forward(const at::Tensor& x, const Rows& rows) {
  std::vector<at::Tensor> qkv = c_attn_->forward(x).chunk(3, -1);
  at::Tensor y = row_attention(split_heads(qkv[0], n_heads_), split_heads(qkv[1], n_heads_),
                               split_heads(qkv[2], n_heads_), rows, dropout_, is_training());
  return maybe_dropout(c_proj_->forward(merge_heads(y)), dropout_, is_training());
}

GPT2MLP::GPT2MLP(const ModelSpec& spec, c10::Device device) : dropout_(spec.dropout) {
  c_fc_ = register_module("c_fc", std::make_shared<Conv1D>(spec.d_model, spec.d_ff, device));
  c_proj_ = register_module("c_proj", std::make_shared<Conv1D>(spec.d_ff, spec.d_model, device));
}

at::Tensor GPT2MLP::forward(const at::Tensor& x) {
  at::Tensor h = at::gelu(c_fc_->forward(x), "tanh");
  return maybe_dropout(c_proj_->forward(h), dropout_, is_training());
}

GPT2Block::GPT2Block(const ModelSpec& spec, c10::Device device) : torch::nn::Module(kTypeName) {
  ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(spec.d_model, spec.norm_eps, device));
  attn_ = register_module("attn", std::make_shared<GPT2Attention>(spec, device));
  ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(spec.d_model, spec.norm_eps, device));
  mlp_ = register_module("mlp", std::make_shared<GPT2MLP>(spec, device));
}

at::Tensor GPT2Block::forward(const at::Tensor& input, const Rows& rows) {
  // The body captures `this` and a copy of the rows: the engine may re-run it in backward
  // (recomputation), after this call has returned.
  return hooked(input, [this, rows](const at::Tensor& x) {
    at::Tensor h = x + attn_->forward(ln_1_->forward(x), rows);
    return h + mlp_->forward(ln_2_->forward(h));
  });
}

GPT2Transformer::GPT2Transformer(const ModelSpec& spec, c10::Device device) {
  wte = register_module("wte", std::make_shared<Embedding>(spec.vocab_size, spec.d_model, device));
  wpe = register_module("wpe", std::make_shared<Embedding>(spec.seq_len, spec.d_model, device));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < spec.n_layers; ++i) {
    blocks.push_back(std::make_shared<GPT2Block>(spec, device));
    h->push_back(blocks.back());
  }
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(spec.d_model, spec.norm_eps, device));
}

GPT2::GPT2(const ModelSpec& spec, c10::Device device) : Model(resolve_spec(spec)) {
  ST_USER_CHECK(spec_.tie_embeddings, "gpt2 always ties the LM head to transformer.wte");
  transformer_ = register_module("transformer", std::make_shared<GPT2Transformer>(spec_, device));
}

at::Tensor GPT2::forward(const at::Tensor& tokens, const Rows& rows) {
  return hooked(tokens, [this, rows](const at::Tensor& input) {
    ST_USER_CHECK(input.dim() == 2, "gpt2: expected token ids [B, T], got ", input.sizes());
    const int64_t t = input.size(1);
    ST_USER_CHECK(t <= spec_.seq_len, "gpt2: sequence of ", t, " tokens exceeds n_positions ",
                  spec_.seq_len);
    // Positions 0..T-1 are the first T rows of wpe (same as embedding(arange(T))); packed rows
    // look up each token's position in its row (the same values, added the same way).
    at::Tensor x = transformer_->wte->forward(input) +
                   (rows.empty() ? transformer_->wpe->weight().narrow(0, 0, t)
                                 : transformer_->wpe->forward(rows.positions.to(input.device())));
    x = maybe_dropout(x, spec_.dropout, is_training());
    for (const auto& block : transformer_->blocks) x = block->forward(x, rows);
    x = transformer_->ln_f->forward(x);
    return model::linear(x, transformer_->wte->weight());  // tied lm_head
  });
}

ParamInit GPT2::init_for(const std::string& name) const {
  using K = ParamInit::Kind;
  if (ends_with(name, ".bias")) return {K::Zeros, 0.0};
  if (name.find(".ln_") != std::string::npos) return {K::Ones, 0.0};
  // GPT-2 paper: residual projections scaled by 1/sqrt(number of residual layers).
  if (ends_with(name, ".c_proj.weight"))
    return {K::Normal, 0.02 / std::sqrt(2.0 * static_cast<double>(spec_.n_layers))};
  ST_CHECK(ends_with(name, ".weight"), "gpt2 has no parameter named ", name);
  return {K::Normal, 0.02};
}

int64_t GPT2::parameter_count(const ModelSpec& s) {
  const int64_t d = s.d_model, f = s.d_ff;
  const int64_t per_block = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * f + f) + (f * d + d);
  return s.vocab_size * d + s.seq_len * d + s.n_layers * per_block + 2 * d;
}

double GPT2::train_flops_per_token(int64_t seq_len) const {
  // The weights (weight_flops_per_token: 6N without a fine-tune) but wpe (a lookup); wte does the
  // work of the tied LM head.
  return weight_flops_per_token({"transformer.wpe.weight"}) +
         12.0 * static_cast<double>(spec_.n_layers * spec_.d_model * seq_len);
}

// Saved per block: 2 LayerNorms, attention, the GELU MLP (layer_norm_block_costs, with what trains
// read from the model); the root adds wte(ids) + wpe (kept by the first ln_1 when it keeps its
// input), the tied LM head, and wpe's gradient at the end of backward.
ActivationBytes GPT2::activation_bytes(const CostQuery& q) const {
  const ModelSpec& s = spec_;
  const ActivationShape x = activation_shape(q, s.d_model, s.d_ff, s.n_heads, s.seq_len, /*causal=*/true,
                                             "transformer.h.0.ln_1.weight");
  const int64_t b = x.b, nd = x.nd();
  const double lora_dropout = s.finetune.lora.dropout;
  std::vector<LayerNormBlockTraining> t;
  for (const auto& blk : transformer_->blocks)
    t.push_back(layer_norm_block_training(*blk, {"ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}, lora_dropout));
  const bool wte = param_trains(*this, "transformer.wte.weight"), wpe = param_trains(*this, "transformer.wpe.weight");
  const bool lnf = layer_norm_trains(*this, "transformer.ln_f");
  ActivationBytes a;
  a.embedding_trains = wte || wpe;
  a.grad_in = b * nd;
  a.block_io = b * nd;
  bool in_rg = wte || wpe;
  for (size_t i = 0; i < t.size(); ++i) {
    const bool next_norm = i + 1 < t.size() ? t[i + 1].ln1 : lnf;
    // The MLP's second projection is a Conv1D: weight [f, d].
    a.blocks.push_back(layer_norm_block_costs(x, s.d_ff, t[i], in_rg, next_norm, s.dropout > 0));
    in_rg = a.blocks.back().backward;
  }
  const NormCost nf = layer_norm_cost(x, in_rg, lnf);
  a.final_norm_bwd = in_rg ? nf.saved + b * nd + layer_norm_backward_bytes(x, lnf) : 0;
  a.head_saved = nf.saved + (wte ? b * nd : 0);  // the tied head saves its input for wte's gradient
  a.last_out_kept = nf.keeps_input ? b * nd : 0;
  const bool first_keeps = layer_norm_cost(x, wte || wpe, t.empty() ? lnf : t[0].ln1).keeps_input;
  a.embed_saved = first_keeps ? b * nd : 0;
  a.embed_saved_rc = 0;
  if (s.dropout > 0 && (wte || wpe)) {  // the embedding dropout's noise
    a.embed_saved += b * nd;
    a.embed_saved_rc += b * nd;
  }
  lm_head_costs(x, s.vocab_size, s.tie_embeddings, wte, wte, nf.out_rg, a);
  if (wpe) a.embed_bwd += b * s.seq_len * s.d_model;
  return a;
}

}  // namespace shardtrain::model
