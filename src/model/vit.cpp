// ViT: Vision Transformer classifier with timm parameter names, see vit.h.
#include "shardtrain/model/vit.h"
#include "layer_norm_block_training.h"
#include "shardtrain/model/bf16_gemm.h"

#include <ATen/ATen.h>

#include "shardtrain/util/error.h"

namespace shardtrain::model {

PatchProjection::PatchProjection(int64_t channels, int64_t patch, int64_t d_model, c10::Device device)
    : patch_(patch) {
  add_param(*this, "weight", {d_model, channels, patch, patch}, device);
  add_param(*this, "bias", {d_model}, device);
}

at::Tensor PatchProjection::forward(const at::Tensor& images) const {
  const int64_t b = images.size(0), c = images.size(1), p = patch_;
  const int64_t gh = images.size(2) / p, gw = images.size(3) / p;
  // [B, C, gh, p, gw, p] -> [B, gh, gw, C, p, p]: each patch flattened in the weight's (C, p, p) order.
  at::Tensor patches = images.reshape({b, c, gh, p, gw, p}).permute({0, 2, 4, 1, 3, 5}).reshape({b, gh * gw, c * p * p});
  const at::Tensor& w = param("weight");
  return model::linear(patches, w.reshape({w.size(0), -1}), param("bias"));
}

ViTAttention::ViTAttention(const ModelSpec& spec, c10::Device device)
    : n_heads_(spec.n_heads), dropout_(spec.dropout) {
  qkv_ = register_module("qkv", std::make_shared<Linear>(spec.d_model, 3 * spec.d_model, true, device));
  proj_ = register_module("proj", std::make_shared<Linear>(spec.d_model, spec.d_model, true, device));
}

at::Tensor ViTAttention::forward(const at::Tensor& x) {
  std::vector<at::Tensor> qkv = qkv_->forward(x).chunk(3, -1);
  at::Tensor y = attention(split_heads(qkv[0], n_heads_), split_heads(qkv[1], n_heads_),
                           split_heads(qkv[2], n_heads_), /*causal=*/false, dropout_, is_training());
  return maybe_dropout(proj_->forward(merge_heads(y)), dropout_, is_training());
}

ViTMLP::ViTMLP(const ModelSpec& spec, c10::Device device) : dropout_(spec.dropout) {
  fc1_ = register_module("fc1", std::make_shared<Linear>(spec.d_model, spec.d_ff, true, device));
  fc2_ = register_module("fc2", std::make_shared<Linear>(spec.d_ff, spec.d_model, true, device));
}

at::Tensor ViTMLP::forward(const at::Tensor& x) {
  return maybe_dropout(fc2_->forward(at::gelu(fc1_->forward(x))), dropout_, is_training());
}

ViTBlock::ViTBlock(const ModelSpec& spec, c10::Device device) : torch::nn::Module(kTypeName) {
  norm1_ = register_module("norm1", std::make_shared<LayerNorm>(spec.d_model, spec.norm_eps, device));
  attn_ = register_module("attn", std::make_shared<ViTAttention>(spec, device));
  norm2_ = register_module("norm2", std::make_shared<LayerNorm>(spec.d_model, spec.norm_eps, device));
  mlp_ = register_module("mlp", std::make_shared<ViTMLP>(spec, device));
}

at::Tensor ViTBlock::forward(const at::Tensor& input) {
  // The body captures only `this`: the engine may re-run it in backward (recomputation).
  return hooked(input, [this](const at::Tensor& x) {
    at::Tensor h = x + attn_->forward(norm1_->forward(x));
    return h + mlp_->forward(norm2_->forward(h));
  });
}

int64_t ViT::num_patches(const ModelSpec& s) {
  return (s.image_size / s.patch_size) * (s.image_size / s.patch_size);
}

ViT::ViT(const ModelSpec& spec, c10::Device device) : Model(resolve_spec(spec)) {
  const int64_t d = spec_.d_model;
  add_param(*this, "cls_token", {1, 1, d}, device);
  add_param(*this, "pos_embed", {1, num_patches(spec_) + 1, d}, device);
  patch_embed_ = register_module("patch_embed", std::make_shared<torch::nn::Module>());
  proj_ = patch_embed_->register_module(
      "proj", std::make_shared<PatchProjection>(spec_.channels, spec_.patch_size, d, device));
  blocks_list_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < spec_.n_layers; ++i) {
    blocks_.push_back(std::make_shared<ViTBlock>(spec_, device));
    blocks_list_->push_back(blocks_.back());
  }
  norm_ = register_module("norm", std::make_shared<LayerNorm>(d, spec_.norm_eps, device));
  head_ = register_module("head", std::make_shared<Linear>(d, spec_.num_classes, true, device));
}

at::Tensor ViT::forward(const at::Tensor& images, const Rows& rows) {
  ST_CHECK(rows.empty(), "vit: images have no rows");
  return hooked(images, [this](const at::Tensor& input) {
    ST_USER_CHECK(input.dim() == 4 && input.size(1) == spec_.channels &&
                      input.size(2) == spec_.image_size && input.size(3) == spec_.image_size,
                  "vit: expected images [B, ", spec_.channels, ", ", spec_.image_size, ", ",
                  spec_.image_size, "], got ", input.sizes());
    const int64_t b = input.size(0);
    at::Tensor x = proj_->forward(input.to(dict_param(*proj_, "weight").scalar_type()));
    const at::Tensor& cls = dict_param(*this, "cls_token");
    x = at::cat({cls.expand({b, 1, cls.size(2)}), x}, 1) + dict_param(*this, "pos_embed");
    x = maybe_dropout(x, spec_.dropout, is_training());
    for (const auto& block : blocks_) x = block->forward(x);
    x = norm_->forward(x);
    return head_->forward(x.select(1, 0));
  });
}

ParamInit ViT::init_for(const std::string& name) const {
  using K = ParamInit::Kind;
  // HF ViT (initializer_range 0.02): every matrix, the class token and the positions
  // normal(0, 0.02); biases zero; LayerNorm weights one.
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends(".bias")) return {K::Zeros, 0.0};
  if (name.find("norm") != std::string::npos) return {K::Ones, 0.0};
  ST_CHECK(ends(".weight") || name == "cls_token" || name == "pos_embed", "vit has no parameter named ", name);
  return {K::Normal, 0.02};
}

int64_t ViT::parameter_count(const ModelSpec& s) {
  const int64_t d = s.d_model, f = s.d_ff;
  const int64_t per_block = 4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d);
  const int64_t embed = d * s.channels * s.patch_size * s.patch_size + d + d + (num_patches(s) + 1) * d;
  return embed + s.n_layers * per_block + 2 * d + (d * s.num_classes + s.num_classes);
}

double ViT::train_flops_per_token(int64_t seq_len) const {
  const int64_t tokens = seq_len > 0 ? seq_len : num_patches(spec_) + 1;
  // The weights (weight_flops_per_token: 6N without a fine-tune) but the lookups (class token,
  // positions); the head runs once per image, not per token, so this slightly overcounts for
  // small token counts.
  return weight_flops_per_token({"cls_token", "pos_embed"}) +
         12.0 * static_cast<double>(spec_.n_layers * spec_.d_model * tokens);
}

double ViT::train_flops_per_item() const {
  return train_flops_per_token(0) * static_cast<double>(num_patches(spec_) + 1);
}

// Saved per block as GPT-2's (layer_norm_block_costs) over patches + 1 tokens without a causal
// mask; the root adds the patch matrix (saved by the projection for its weight gradient), the
// tokens entering the first block, and a [B, num_classes] head.
ActivationBytes ViT::activation_bytes(const CostQuery& q) const {
  const ModelSpec& s = spec_;
  const ActivationShape x = activation_shape(q, s.d_model, s.d_ff, s.n_heads, num_patches(s) + 1, /*causal=*/false,
                                             "blocks.0.norm1.weight");
  const int64_t b = x.b, B = x.B, d = s.d_model, nd = x.nd();
  const int64_t image = s.channels * s.image_size * s.image_size;
  const double lora_dropout = s.finetune.lora.dropout;
  std::vector<LayerNormBlockTraining> t;
  for (const auto& blk : blocks_)
    t.push_back(layer_norm_block_training(*blk, {"norm1", "norm2", "attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"}, lora_dropout));
  const bool proj = param_trains(*this, "patch_embed.proj.weight");
  const bool embed_rg = proj || param_trains(*this, "patch_embed.proj.bias") || param_trains(*this, "cls_token") ||
                        param_trains(*this, "pos_embed");
  const bool lnf = layer_norm_trains(*this, "norm"), head = param_trains(*this, "head.weight");
  ActivationBytes a;
  a.embedding_trains = embed_rg;
  a.grad_in = b * nd;
  a.block_io = b * nd;
  bool in_rg = embed_rg;
  for (size_t i = 0; i < t.size(); ++i) {
    const bool next_norm = i + 1 < t.size() ? t[i + 1].ln1 : lnf;
    // The MLP's second projection is a Linear: weight [d, f].
    a.blocks.push_back(layer_norm_block_costs(x, d, t[i], in_rg, next_norm, s.dropout > 0));
    in_rg = a.blocks.back().backward;
  }
  const NormCost nf = layer_norm_cost(x, in_rg, lnf);
  a.final_norm_bwd = in_rg ? nf.saved + b * nd + layer_norm_backward_bytes(x, lnf) : 0;
  // The head reads the class token of the norm's output (a view: saving it keeps the whole output).
  a.head_saved = nf.saved + (head ? b * nd : 0);
  a.last_out_kept = nf.keeps_input ? b * nd : 0;
  const int64_t patches = proj ? b * B * image : 0;
  const bool first_keeps = layer_norm_cost(x, embed_rg, t.empty() ? lnf : t[0].ln1).keeps_input;
  a.embed_saved = patches + (first_keeps ? b * nd : 0);
  a.embed_saved_rc = patches;
  if (s.dropout > 0 && embed_rg) {  // the embedding dropout's noise
    a.embed_saved += b * nd;
    a.embed_saved_rc += b * nd;
  }
  a.inputs = 4 * B * image + 8 * B + (x.mixed ? b * B * image : 0);
  const int64_t logits = 4 * B * s.num_classes;
  a.head_fwd_work = 2 * logits;
  a.head_bwd_work = 3 * logits;
  a.head_bwd_mm = logits + (nf.out_rg ? 4 * B * d : 0) + (head ? 4 * d * s.num_classes : 0);
  return a;
}

}  // namespace shardtrain::model
