// ViT: a Vision Transformer classifier (patch embedding, class token, learned positions,
// pre-norm blocks) with timm VisionTransformer parameter names (blocks.{i}...).
#pragma once
#include <torch/nn/modules/container/modulelist.h>

#include "shardtrain/model/layers.h"
#include "shardtrain/model/model.h"

namespace shardtrain::model {

// Cuts images [B, C, H, W] into non-overlapping p x p patches and projects each one:
// weight [d, C, p, p] (the Conv2d layout of timm/HF), bias [d] -> [B, N, d]. Same result
// as conv2d(stride p), computed as one matmul over the flattened patches.
class PatchProjection : public ParamModule {
 public:
  PatchProjection(int64_t channels, int64_t patch, int64_t d_model, c10::Device device);
  at::Tensor forward(const at::Tensor& images) const;

 private:
  int64_t patch_;
};

class ViTAttention : public torch::nn::Module {
 public:
  ViTAttention(const ModelSpec& spec, c10::Device device);
  at::Tensor forward(const at::Tensor& x);

 private:
  int64_t n_heads_;
  double dropout_;
  std::shared_ptr<Linear> qkv_, proj_;
};

class ViTMLP : public torch::nn::Module {
 public:
  ViTMLP(const ModelSpec& spec, c10::Device device);
  at::Tensor forward(const at::Tensor& x);

 private:
  double dropout_;
  std::shared_ptr<Linear> fc1_, fc2_;
};

class ViTBlock : public torch::nn::Module, public fsdp::Hookable {
 public:
  static constexpr const char* kTypeName = "ViTBlock";  // what name() returns
  ViTBlock(const ModelSpec& spec, c10::Device device);
  at::Tensor forward(const at::Tensor& x);

 private:
  std::shared_ptr<LayerNorm> norm1_, norm2_;
  std::shared_ptr<ViTAttention> attn_;
  std::shared_ptr<ViTMLP> mlp_;
};

// Images [B, C, H, W] -> logits [B, num_classes], read from the class token.
class ViT : public Model {
 public:
  ViT(const ModelSpec& spec, c10::Device device);
  using Model::forward;
  at::Tensor forward(const at::Tensor& input, const Rows& rows) override;
  ParamInit init_for(const std::string& name) const override;
  std::vector<std::string> block_types() const override { return {ViTBlock::kTypeName}; }
  // PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for the architecture.
  std::vector<std::string> default_lora_targets() const override { return {"qkv"}; }
  std::vector<std::string> no_decay_patterns() const override {
    return {".bias", "norm", "cls_token", "pos_embed"};
  }
  // seq_len <= 0 means the model's own token count (patches + class token).
  double train_flops_per_token(int64_t seq_len) const override;
  ActivationBytes activation_bytes(const CostQuery& q) const override;
  double train_flops_per_item() const override;

  static int64_t parameter_count(const ModelSpec& resolved);
  static int64_t num_patches(const ModelSpec& resolved);

 private:
  std::shared_ptr<torch::nn::Module> patch_embed_;
  std::shared_ptr<PatchProjection> proj_;
  torch::nn::ModuleList blocks_list_;
  std::vector<std::shared_ptr<ViTBlock>> blocks_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Linear> head_;
};

}  // namespace shardtrain::model
