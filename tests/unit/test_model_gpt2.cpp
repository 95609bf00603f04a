// Tests of the GPT-2 model: HF names and sizes on meta, numerics against a hand-written
// reference, causality, parameter-dict swaps, init rules, loss at init, FLOPs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "shardtrain/model/gpt2.h"
#include "shardtrain/util/error.h"
#include "test_model_util.h"

namespace shardtrain::model {
namespace {
using namespace shardtrain::model::testing;

ModelSpec tiny_gpt2() {
  ModelSpec s;
  s.arch = "gpt2";
  s.vocab_size = 37;
  s.seq_len = 12;
  s.d_model = 16;
  s.n_layers = 2;
  s.n_heads = 4;
  return s;
}

// HF GPT-2 forward for one sequence, from named parameters and the formulas.
at::Tensor reference_gpt2(const torch::nn::Module& m, const ModelSpec& s, const at::Tensor& ids) {
  auto P = [&](const std::string& n) { return param_of(m, n); };
  const int64_t t = ids.size(0), d = s.d_model, hd = d / s.n_heads;
  at::Tensor x = P("transformer.wte.weight").index_select(0, ids) + P("transformer.wpe.weight").slice(0, 0, t);
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string b = "transformer.h." + std::to_string(l) + ".";
    at::Tensor h = ref_layer_norm(x, P(b + "ln_1.weight"), P(b + "ln_1.bias"), 1e-5);
    at::Tensor qkv = h.mm(P(b + "attn.c_attn.weight")) + P(b + "attn.c_attn.bias");
    std::vector<at::Tensor> heads;
    for (int64_t i = 0; i < s.n_heads; ++i)
      heads.push_back(ref_head_attention(qkv.slice(1, i * hd, (i + 1) * hd), qkv.slice(1, d + i * hd, d + (i + 1) * hd),
                                         qkv.slice(1, 2 * d + i * hd, 2 * d + (i + 1) * hd), /*causal=*/true));
    x = x + at::cat(heads, 1).mm(P(b + "attn.c_proj.weight")) + P(b + "attn.c_proj.bias");
    h = ref_layer_norm(x, P(b + "ln_2.weight"), P(b + "ln_2.bias"), 1e-5);
    h = ref_gelu_tanh(h.mm(P(b + "mlp.c_fc.weight")) + P(b + "mlp.c_fc.bias"));
    x = x + h.mm(P(b + "mlp.c_proj.weight")) + P(b + "mlp.c_proj.bias");
  }
  x = ref_layer_norm(x, P("transformer.ln_f.weight"), P("transformer.ln_f.bias"), 1e-5);
  return x.mm(P("transformer.wte.weight").t());
}

TEST(ModelGpt2, Preset124mOnMetaHasHfNamesShapesAndCount) {
  const ModelSpec spec = preset_spec("gpt2-124m");
  auto model = build_model(spec, at::kMeta);
  auto shapes = shapes_of(*model);
  EXPECT_EQ(numel_of(*model), 124439808);  // HF GPT2LMHeadModel.num_parameters()
  EXPECT_EQ(parameter_count(spec), 124439808);
  EXPECT_EQ(shapes.size(), 2u + 12u * 12u + 2u);
  using V = std::vector<int64_t>;
  EXPECT_EQ(shapes["transformer.wte.weight"], (V{50257, 768}));
  EXPECT_EQ(shapes["transformer.wpe.weight"], (V{1024, 768}));
  EXPECT_EQ(shapes["transformer.ln_f.weight"], (V{768}));
  EXPECT_EQ(shapes["transformer.ln_f.bias"], (V{768}));
  for (int l : {0, 11}) {
    const std::string b = "transformer.h." + std::to_string(l) + ".";
    EXPECT_EQ(shapes[b + "ln_1.weight"], (V{768}));
    EXPECT_EQ(shapes[b + "ln_1.bias"], (V{768}));
    EXPECT_EQ(shapes[b + "attn.c_attn.weight"], (V{768, 2304}));
    EXPECT_EQ(shapes[b + "attn.c_attn.bias"], (V{2304}));
    EXPECT_EQ(shapes[b + "attn.c_proj.weight"], (V{768, 768}));
    EXPECT_EQ(shapes[b + "attn.c_proj.bias"], (V{768}));
    EXPECT_EQ(shapes[b + "ln_2.weight"], (V{768}));
    EXPECT_EQ(shapes[b + "mlp.c_fc.weight"], (V{768, 3072}));
    EXPECT_EQ(shapes[b + "mlp.c_fc.bias"], (V{3072}));
    EXPECT_EQ(shapes[b + "mlp.c_proj.weight"], (V{3072, 768}));
    EXPECT_EQ(shapes[b + "mlp.c_proj.bias"], (V{768}));
  }
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u);  // tied to wte
  for (const auto& p : model->parameters()) {
    EXPECT_TRUE(p.is_meta());
    EXPECT_TRUE(p.requires_grad());
    EXPECT_EQ(p.scalar_type(), at::kFloat);
  }
}

TEST(ModelGpt2, PresetCountsMatchHuggingFace) {
  EXPECT_EQ(parameter_count(preset_spec("gpt2-355m")), 354823168);
  EXPECT_EQ(parameter_count(preset_spec("gpt2-774m")), 774030080);
  EXPECT_EQ(parameter_count(preset_spec("gpt2-1.5b")), 1557611200);
  auto medium = build_model(preset_spec("gpt2-355m"), at::kMeta);
  EXPECT_EQ(numel_of(*medium), 354823168);
  EXPECT_EQ(medium->spec().d_ff, 4096);
  EXPECT_THROW(preset_spec("gpt2-7b"), UserError);
}

TEST(ModelGpt2, ForwardAndBackwardOnMeta) {
  auto model = build_model(preset_spec("gpt2-124m"), at::kMeta);
  at::Tensor ids = at::zeros({2, 64}, at::TensorOptions().dtype(at::kLong).device(at::kMeta));
  at::Tensor logits = model->forward(ids);
  EXPECT_TRUE(logits.is_meta());
  EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{2, 64, 50257}));
  at::Tensor loss = model->loss(ids, ids);
  EXPECT_EQ(loss.dim(), 0);
  loss.backward();
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_TRUE(item.value().grad().is_meta());
    EXPECT_EQ(item.value().grad().sizes(), item.value().sizes()) << item.key();
  }
}

TEST(ModelGpt2, MatchesHandWrittenReference) {
  const ModelSpec spec = tiny_gpt2();
  auto model = build_model(spec, at::kCPU);
  fill_random(*model, 7, 0.3);
  at::Tensor ids = at::randint(spec.vocab_size, {3, 10}, at::TensorOptions().dtype(at::kLong));
  at::Tensor logits = model->forward(ids);
  ASSERT_EQ(logits.sizes().vec(), (std::vector<int64_t>{3, 10, 37}));
  for (int64_t b = 0; b < 3; ++b) {
    at::Tensor ref = reference_gpt2(*model, spec, ids[b]);
    EXPECT_TRUE(at::allclose(logits[b], ref, 1e-4, 1e-5)) << (logits[b] - ref).abs().max().item<float>();
  }
  // Logits of this size make the comparison meaningful (not two near-zero tensors).
  EXPECT_GT(logits.std().item<double>(), 0.3);
}

TEST(ModelGpt2, FutureTokensDoNotChangeEarlierLogits) {
  const ModelSpec spec = tiny_gpt2();
  auto model = build_model(spec, at::kCPU);
  fill_random(*model, 3, 0.3);
  at::Tensor ids = at::randint(spec.vocab_size, {1, 12}, at::TensorOptions().dtype(at::kLong));
  at::Tensor changed = ids.clone();
  changed[0][7] = (ids[0][7].item<int64_t>() + 1) % spec.vocab_size;
  at::Tensor a = model->forward(ids), b = model->forward(changed);
  EXPECT_TRUE(at::equal(a.slice(1, 0, 7), b.slice(1, 0, 7)));
  EXPECT_FALSE(at::allclose(a.slice(1, 7), b.slice(1, 7)));
}

TEST(ModelGpt2, PackedRowsAreComputedAsIfAlone) {
  const ModelSpec spec = tiny_gpt2();
  auto model = build_model(spec, at::kCPU);
  fill_random(*model, 23, 0.3);
  // Learned positions: each row reads wpe rows 0..L-1.
  expect_rows_as_if_alone(*model, spec.vocab_size, spec.seq_len, {{4, 6}, {2, 2, 2}}, 24);
}

TEST(ModelGpt2, ForwardReadsParametersSwappedIntoTheDicts) {
  const ModelSpec spec = tiny_gpt2();
  auto cpu = build_model(spec, at::kCPU);
  fill_random(*cpu, 11, 0.3);
  auto cpu_params = cpu->named_parameters();
  auto meta = build_model(spec, at::kMeta);
  // Fresh leaf tensors with the CPU model's values, as the engine's flat-buffer views would be.
  std::map<std::string, at::Tensor> fresh;
  const int64_t swapped = swap_parameters(*meta, [&](const std::string& name) {
    return fresh[name] = cpu_params[name].detach().clone().requires_grad_(true);
  });
  EXPECT_EQ(swapped, static_cast<int64_t>(cpu_params.size()));
  at::Tensor ids = at::randint(spec.vocab_size, {2, 9}, at::TensorOptions().dtype(at::kLong));
  at::Tensor out = meta->forward(ids);
  ASSERT_FALSE(out.is_meta());
  EXPECT_TRUE(at::allclose(out, cpu->forward(ids)));
  meta->loss(ids, ids).backward();
  for (auto& item : fresh) EXPECT_TRUE(item.second.grad().defined()) << item.first;
  // And the swap is live: scaling a swapped tensor in place changes the output.
  { at::NoGradGuard g; fresh["transformer.h.1.mlp.c_fc.weight"].mul_(2.0); }
  EXPECT_FALSE(at::allclose(meta->forward(ids), out));
}

TEST(ModelGpt2, BlockTypesNameTheBlocksAsLibtorchReportsThem) {
  auto model = build_model(tiny_gpt2(), at::kMeta);
  ASSERT_EQ(model->block_types().size(), 1u);
  int blocks = 0;
  for (const auto& m : model->modules()) {
    if (m->name() == model->block_types()[0]) {
      ++blocks;
      EXPECT_NE(dynamic_cast<fsdp::Hookable*>(m.get()), nullptr);
    }
  }
  EXPECT_EQ(blocks, 2);
  EXPECT_EQ(model->named_modules()["transformer.h.0"]->name(), "GPT2Block");
}

TEST(ModelGpt2, InitRulesFollowHfAndThePaperScaling) {
  auto model = build_model(preset_spec("gpt2-124m"), at::kMeta);
  using K = ParamInit::Kind;
  EXPECT_EQ(model->init_for("transformer.h.3.attn.c_attn.bias").kind, K::Zeros);
  EXPECT_EQ(model->init_for("transformer.h.3.ln_1.weight").kind, K::Ones);
  EXPECT_EQ(model->init_for("transformer.ln_f.weight").kind, K::Ones);
  EXPECT_EQ(model->init_for("transformer.wte.weight").kind, K::Normal);
  EXPECT_DOUBLE_EQ(model->init_for("transformer.wpe.weight").scale, 0.02);
  EXPECT_DOUBLE_EQ(model->init_for("transformer.h.0.mlp.c_fc.weight").scale, 0.02);
  EXPECT_DOUBLE_EQ(model->init_for("transformer.h.0.attn.c_proj.weight").scale, 0.02 / std::sqrt(24.0));
  EXPECT_DOUBLE_EQ(model->init_for("transformer.h.0.mlp.c_proj.weight").scale, 0.02 / std::sqrt(24.0));
  for (const auto& item : model->named_parameters()) (void)model->init_for(item.key());  // all covered
}

TEST(ModelGpt2, InitParametersIsDeterministicAndFollowsTheRules) {
  ModelSpec spec = tiny_gpt2();
  spec.d_model = 64;
  spec.n_layers = 8;
  auto a = build_model(spec, at::kCPU), b = build_model(spec, at::kCPU);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& item : pa) EXPECT_TRUE(at::equal(item.value(), pb[item.key()])) << item.key();
  EXPECT_TRUE(at::equal(pa["transformer.h.0.ln_2.weight"], at::ones({64})));
  EXPECT_TRUE(at::equal(pa["transformer.h.0.mlp.c_fc.bias"], at::zeros({256})));
  EXPECT_NEAR(pa["transformer.h.0.mlp.c_fc.weight"].std().item<double>(), 0.02, 0.001);
  EXPECT_NEAR(pa["transformer.h.0.mlp.c_proj.weight"].std().item<double>(), 0.02 / 4.0, 0.0005);
  EXPECT_FALSE(at::equal(pa["transformer.h.0.mlp.c_fc.weight"], pa["transformer.h.1.mlp.c_fc.weight"]));
  init_parameters(*b, /*run_seed=*/1);
  EXPECT_FALSE(at::equal(pa["transformer.wte.weight"], b->named_parameters()["transformer.wte.weight"]));
}

TEST(ModelGpt2, LossAtInitIsNearLogVocab) {
  ModelSpec spec = tiny_gpt2();
  spec.vocab_size = 512;
  spec.d_model = 64;
  spec.seq_len = 32;
  auto model = build_model(spec, at::kCPU);
  at::Tensor ids = at::randint(512, {4, 32}, at::TensorOptions().dtype(at::kLong));
  at::Tensor targets = at::randint(512, {4, 32}, at::TensorOptions().dtype(at::kLong));
  EXPECT_NEAR(model->loss(ids, targets).item<double>(), std::log(512.0), 0.05);
}

TEST(ModelGpt2, DropoutOnlyWhenTraining) {
  ModelSpec spec = tiny_gpt2();
  spec.dropout = 0.5;
  auto model = build_model(spec, at::kCPU);
  at::Tensor ids = at::randint(spec.vocab_size, {2, 8}, at::TensorOptions().dtype(at::kLong));
  model->eval();
  EXPECT_TRUE(at::equal(model->forward(ids), model->forward(ids)));
  model->train();
  EXPECT_FALSE(at::equal(model->forward(ids), model->forward(ids)));
}

TEST(ModelGpt2, TrainFlopsFollowSixNPlusAttention) {
  auto model = build_model(preset_spec("gpt2-124m"), at::kMeta);
  const double n = 124439808.0 - 1024.0 * 768.0;  // without wpe
  EXPECT_DOUBLE_EQ(model->train_flops_per_token(1024), 6.0 * n + 12.0 * 12 * 768 * 1024);
}

TEST(ModelGpt2, RejectsBadSpecs) {
  ModelSpec spec = tiny_gpt2();
  spec.n_heads = 5;
  EXPECT_THROW(build_model(spec, at::kMeta), UserError);
  spec = tiny_gpt2();
  spec.tie_embeddings = false;
  EXPECT_THROW(build_model(spec, at::kMeta), UserError);
  auto model = build_model(tiny_gpt2(), at::kCPU);
  EXPECT_THROW(model->forward(at::zeros({1, 13}, at::TensorOptions().dtype(at::kLong))), UserError);
  EXPECT_THROW(model->forward(at::zeros({13}, at::TensorOptions().dtype(at::kLong))), UserError);
}

}  // namespace
}  // namespace shardtrain::model
