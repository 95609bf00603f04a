// Llama: a Llama-style decoder (RMSNorm, SwiGLU, rotary embeddings, grouped-query
// attention) with Hugging Face LlamaForCausalLM parameter names (model.layers.{i}...).
#pragma once
#include <torch/nn/modules/container/modulelist.h>

#include "shardtrain/model/layers.h"
#include "shardtrain/model/model.h"

namespace shardtrain::model {

// cos/sin tables [T, head_dim] in fp32 for positions 0..T-1 (HF layout: the half-size
// frequency table concatenated with itself), on inv_freq's device.
struct RotaryTables {
  at::Tensor cos, sin;
};
// The inverse frequencies [head_dim / 2] (fp32) of a resolved llama spec: rope_theta, head_dim
// and rope_scaling (default, linear, llama3) as transformers computes them.
at::Tensor rope_inv_freq(const ModelSpec& resolved, c10::Device device);
RotaryTables rotary_tables(int64_t seq_len, const at::Tensor& inv_freq);
// Rows packed apart: each token's row of the tables, [B, 1, T, hd] (positions [B, T]).
RotaryTables rotary_at(const RotaryTables& rope, const at::Tensor& positions);
// HF apply_rotary_pos_emb for x [B, H, T, hd]: x*cos + rotate_half(x)*sin (tables [T, hd] or
// [B, 1, T, hd]).
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& rope);

class LlamaAttention : public torch::nn::Module {
 public:
  LlamaAttention(const ModelSpec& spec, c10::Device device);
  at::Tensor forward(const at::Tensor& x, const RotaryTables& rope, const Rows& rows = {});

 private:
  int64_t n_heads_, n_kv_heads_;
  double dropout_;
  std::shared_ptr<Linear> q_proj_, k_proj_, v_proj_, o_proj_;
};

// SwiGLU: down(silu(gate(x)) * up(x)).
class LlamaMLP : public torch::nn::Module {
 public:
  LlamaMLP(const ModelSpec& spec, c10::Device device);
  at::Tensor forward(const at::Tensor& x);

 private:
  std::shared_ptr<Linear> gate_proj_, up_proj_, down_proj_;
};

class LlamaDecoderLayer : public torch::nn::Module, public fsdp::Hookable {
 public:
  static constexpr const char* kTypeName = "LlamaDecoderLayer";  // what name() returns
  LlamaDecoderLayer(const ModelSpec& spec, c10::Device device);
  at::Tensor forward(const at::Tensor& x, const RotaryTables& rope, const Rows& rows = {});

 private:
  double dropout_;
  std::shared_ptr<RMSNorm> input_layernorm_, post_attention_layernorm_;
  std::shared_ptr<LlamaAttention> self_attn_;
  std::shared_ptr<LlamaMLP> mlp_;
};

// The "model" submodule: embed_tokens, layers, norm.
class LlamaBackbone : public torch::nn::Module {
 public:
  LlamaBackbone(const ModelSpec& spec, c10::Device device);
  std::shared_ptr<Embedding> embed_tokens;
  torch::nn::ModuleList layers;
  std::vector<std::shared_ptr<LlamaDecoderLayer>> blocks;
  std::shared_ptr<RMSNorm> norm;
};

// Tokens [B, T] -> logits [B, T, V]. lm_head.weight [V, d] unless spec.tie_embeddings,
// in which case the head reuses model.embed_tokens.weight and has no parameter.
class Llama : public Model {
 public:
  Llama(const ModelSpec& spec, c10::Device device);
  using Model::forward;
  at::Tensor forward(const at::Tensor& input, const Rows& rows) override;
  ParamInit init_for(const std::string& name) const override;
  std::vector<std::string> block_types() const override { return {LlamaDecoderLayer::kTypeName}; }
  // PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for the architecture.
  std::vector<std::string> default_lora_targets() const override { return {"q_proj", "v_proj"}; }
  std::vector<std::string> no_decay_patterns() const override { return {"norm", ".bias"}; }
  std::vector<std::string> norm_param_patterns() const override { return {"norm"}; }
  double train_flops_per_token(int64_t seq_len) const override;
  ActivationBytes activation_bytes(const CostQuery& q) const override;

  static int64_t parameter_count(const ModelSpec& resolved);

 private:
  std::shared_ptr<LlamaBackbone> model_;
  std::shared_ptr<Linear> lm_head_;  // null when tied
};

}  // namespace shardtrain::model
