// GPT2: the Hugging Face GPT-2 architecture with HF parameter names (transformer.h.{i}...).
#pragma once
#include <torch/nn/modules/container/modulelist.h>

#include "shardtrain/model/layers.h"
#include "shardtrain/model/model.h"

namespace shardtrain::model {

class GPT2Attention : public torch::nn::Module {
 public:
  GPT2Attention(const ModelSpec& spec, c10::Device device);
  at::Tensor forward(const at::Tensor& x, const Rows& rows = {});

 private:
  int64_t n_heads_;
  double dropout_;
  std::shared_ptr<Conv1D> c_attn_, c_proj_;
};

class GPT2MLP : public torch::nn::Module {
 public:
  GPT2MLP(const ModelSpec& spec, c10::Device device);
  at::Tensor forward(const at::Tensor& x);

 private:
  double dropout_;
  std::shared_ptr<Conv1D> c_fc_, c_proj_;
};

// One pre-norm transformer block; the FSDP unit of the default wrap policy.
class GPT2Block : public torch::nn::Module, public fsdp::Hookable {
 public:
  static constexpr const char* kTypeName = "GPT2Block";  // what name() returns
  GPT2Block(const ModelSpec& spec, c10::Device device);
  at::Tensor forward(const at::Tensor& x, const Rows& rows = {});

 private:
  std::shared_ptr<LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<GPT2Attention> attn_;
  std::shared_ptr<GPT2MLP> mlp_;
};

// The "transformer" submodule: embeddings, blocks "h", final norm.
class GPT2Transformer : public torch::nn::Module {
 public:
  GPT2Transformer(const ModelSpec& spec, c10::Device device);
  std::shared_ptr<Embedding> wte, wpe;
  torch::nn::ModuleList h;
  std::vector<std::shared_ptr<GPT2Block>> blocks;
  std::shared_ptr<LayerNorm> ln_f;
};

// Tokens [B, T] -> logits [B, T, V]; the LM head is tied to transformer.wte.weight.
class GPT2 : public Model {
 public:
  GPT2(const ModelSpec& spec, c10::Device device);
  using Model::forward;
  at::Tensor forward(const at::Tensor& input, const Rows& rows) override;
  ParamInit init_for(const std::string& name) const override;
  std::vector<std::string> block_types() const override { return {GPT2Block::kTypeName}; }
  // PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for the architecture.
  std::vector<std::string> default_lora_targets() const override { return {"c_attn"}; }
  double train_flops_per_token(int64_t seq_len) const override;
  ActivationBytes activation_bytes(const CostQuery& q) const override;

  static int64_t parameter_count(const ModelSpec& resolved);

 private:
  std::shared_ptr<GPT2Transformer> transformer_;
};

}  // namespace shardtrain::model
