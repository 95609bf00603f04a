// Tests of the ViT classifier: names and shapes, patch projection equal to a strided
// conv, numerics against a hand-written reference, meta forward/backward, dict swaps,
// and the shared Model::loss on class labels.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "shardtrain/model/vit.h"
#include "shardtrain/util/error.h"
#include "test_model_util.h"

namespace shardtrain::model {
namespace {
using namespace shardtrain::model::testing;

ModelSpec tiny_vit() {
  ModelSpec s;
  s.arch = "vit";
  s.image_size = 28;
  s.patch_size = 7;
  s.channels = 1;
  s.num_classes = 10;
  s.d_model = 24;
  s.n_layers = 2;
  s.n_heads = 3;
  return s;
}

at::Tensor reference_vit(const torch::nn::Module& m, const ModelSpec& s, const at::Tensor& image) {
  auto P = [&](const std::string& n) { return param_of(m, n); };
  const int64_t d = s.d_model, hd = d / s.n_heads;
  at::Tensor patches = at::conv2d(image.unsqueeze(0), P("patch_embed.proj.weight"), P("patch_embed.proj.bias"),
                                  {s.patch_size, s.patch_size});
  at::Tensor x = at::cat({P("cls_token")[0], patches[0].flatten(1).t()}, 0) + P("pos_embed")[0];
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    at::Tensor h = ref_layer_norm(x, P(b + "norm1.weight"), P(b + "norm1.bias"), s.norm_eps);
    at::Tensor qkv = h.mm(P(b + "attn.qkv.weight").t()) + P(b + "attn.qkv.bias");
    std::vector<at::Tensor> heads;
    for (int64_t i = 0; i < s.n_heads; ++i)
      heads.push_back(ref_head_attention(qkv.slice(1, i * hd, (i + 1) * hd), qkv.slice(1, d + i * hd, d + (i + 1) * hd),
                                         qkv.slice(1, 2 * d + i * hd, 2 * d + (i + 1) * hd), /*causal=*/false));
    x = x + at::cat(heads, 1).mm(P(b + "attn.proj.weight").t()) + P(b + "attn.proj.bias");
    h = ref_layer_norm(x, P(b + "norm2.weight"), P(b + "norm2.bias"), s.norm_eps);
    h = ref_gelu_erf(h.mm(P(b + "mlp.fc1.weight").t()) + P(b + "mlp.fc1.bias"));
    x = x + h.mm(P(b + "mlp.fc2.weight").t()) + P(b + "mlp.fc2.bias");
  }
  x = ref_layer_norm(x, P("norm.weight"), P("norm.bias"), s.norm_eps);
  return x[0].matmul(P("head.weight").t()) + P("head.bias");
}

TEST(ModelVit, NamesAndShapes) {
  const ModelSpec spec = tiny_vit();
  auto model = build_model(spec, at::kMeta);
  auto shapes = shapes_of(*model);
  using V = std::vector<int64_t>;
  EXPECT_EQ(shapes.size(), 4u + 2u * 12u + 4u);
  EXPECT_EQ(shapes["cls_token"], (V{1, 1, 24}));
  EXPECT_EQ(shapes["pos_embed"], (V{1, 17, 24}));  // 16 patches + class token
  EXPECT_EQ(shapes["patch_embed.proj.weight"], (V{24, 1, 7, 7}));
  EXPECT_EQ(shapes["patch_embed.proj.bias"], (V{24}));
  EXPECT_EQ(shapes["blocks.1.norm1.weight"], (V{24}));
  EXPECT_EQ(shapes["blocks.1.attn.qkv.weight"], (V{72, 24}));
  EXPECT_EQ(shapes["blocks.1.attn.qkv.bias"], (V{72}));
  EXPECT_EQ(shapes["blocks.1.attn.proj.weight"], (V{24, 24}));
  EXPECT_EQ(shapes["blocks.1.norm2.bias"], (V{24}));
  EXPECT_EQ(shapes["blocks.1.mlp.fc1.weight"], (V{96, 24}));
  EXPECT_EQ(shapes["blocks.1.mlp.fc2.weight"], (V{24, 96}));
  EXPECT_EQ(shapes["norm.weight"], (V{24}));
  EXPECT_EQ(shapes["head.weight"], (V{10, 24}));
  EXPECT_EQ(shapes["head.bias"], (V{10}));
  EXPECT_EQ(numel_of(*model), parameter_count(spec));
  EXPECT_EQ(model->named_modules()["blocks.0"]->name(), model->block_types()[0]);
  for (const auto& item : model->named_parameters()) (void)model->init_for(item.key());
  EXPECT_EQ(model->init_for("cls_token").kind, ParamInit::Kind::Normal);
  EXPECT_EQ(model->init_for("blocks.0.norm2.weight").kind, ParamInit::Kind::Ones);
}

TEST(ModelVit, MnistBatchGivesClassLogitsOnCpuAndMeta) {
  auto cpu = build_model(tiny_vit(), at::kCPU);
  EXPECT_EQ(cpu->forward(at::randn({5, 1, 28, 28})).sizes().vec(), (std::vector<int64_t>{5, 10}));
  auto meta = build_model(tiny_vit(), at::kMeta);
  at::Tensor images = at::empty({5, 1, 28, 28}, at::TensorOptions().device(at::kMeta));
  at::Tensor labels = at::empty({5}, at::TensorOptions().device(at::kMeta).dtype(at::kLong));
  EXPECT_EQ(meta->forward(images).sizes().vec(), (std::vector<int64_t>{5, 10}));
  meta->loss(images, labels).backward();
  for (const auto& item : meta->named_parameters()) EXPECT_TRUE(item.value().grad().defined()) << item.key();
  EXPECT_THROW(cpu->forward(at::randn({5, 3, 28, 28})), UserError);
}

TEST(ModelVit, MatchesHandWrittenReference) {
  const ModelSpec spec = tiny_vit();
  auto model = build_model(spec, at::kCPU);
  fill_random(*model, 21, 0.3);
  at::Tensor images = at::randn({3, 1, 28, 28});
  at::Tensor logits = model->forward(images);
  EXPECT_GT(logits.std().item<double>(), 0.3);
  for (int64_t b = 0; b < 3; ++b) {
    at::Tensor ref = reference_vit(*model, spec, images[b]);
    EXPECT_TRUE(at::allclose(logits[b], ref, 1e-4, 1e-4)) << (logits[b] - ref).abs().max().item<float>();
  }
}

TEST(ModelVit, PatchProjectionEqualsStridedConvForSeveralChannels) {
  PatchProjection proj(3, 4, 8, at::kCPU);
  fill_random(proj, 2, 1.0);
  at::Tensor images = at::randn({2, 3, 16, 12});
  at::Tensor ours = proj.forward(images);
  at::Tensor conv = at::conv2d(images, param_of(proj, "weight"), param_of(proj, "bias"), {4, 4});
  EXPECT_TRUE(at::allclose(ours, conv.flatten(2).transpose(1, 2), 1e-4, 1e-5));
}

TEST(ModelVit, ForwardReadsParametersSwappedIntoTheDictsAndLossOnLabels) {
  const ModelSpec spec = tiny_vit();
  auto cpu = build_model(spec, at::kCPU);
  fill_random(*cpu, 23, 0.3);
  auto cpu_params = cpu->named_parameters();
  auto meta = build_model(spec, at::kMeta);
  const int64_t swapped = swap_parameters(*meta, [&](const std::string& name) {
    return cpu_params[name].detach().clone().requires_grad_(true);
  });
  EXPECT_EQ(swapped, static_cast<int64_t>(cpu_params.size()));
  at::Tensor images = at::randn({4, 1, 28, 28});
  at::Tensor labels = at::tensor(std::vector<int64_t>{0, 3, 9, 3});
  at::Tensor logits = cpu->forward(images);
  EXPECT_TRUE(at::allclose(meta->forward(images), logits));
  const double expected = at::cross_entropy_loss(logits, labels).item<double>();
  EXPECT_NEAR(meta->loss(images, labels).item<double>(), expected, 1e-5);
}

TEST(ModelVit, RejectsPatchesThatDoNotTile) {
  ModelSpec spec = tiny_vit();
  spec.patch_size = 5;
  EXPECT_THROW(build_model(spec, at::kMeta), UserError);
}

}  // namespace
}  // namespace shardtrain::model
