// Tests of the Llama-style decoder: HF names and GQA shapes, meta forward/backward,
// numerics against a hand-written reference (RMSNorm, RoPE, GQA, SwiGLU), causality,
// parameter-dict swaps, mixed-precision norms.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "shardtrain/model/llama.h"
#include "shardtrain/util/error.h"
#include "test_model_util.h"

namespace shardtrain::model {
namespace {
using namespace shardtrain::model::testing;

ModelSpec tiny_llama() {
  ModelSpec s;
  s.arch = "llama";
  s.vocab_size = 41;
  s.seq_len = 16;
  s.d_model = 32;
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.tie_embeddings = false;
  s.norm_eps = 1e-6;
  return s;
}

at::Tensor ref_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  return x / (x.pow(2).mean({-1}, true) + eps).sqrt() * w;
}

// HF rotate_half convention written out: pairs (i, i + hd/2) rotate by t * theta^(-2i/hd).
at::Tensor ref_rope(const at::Tensor& x, double theta) {
  const int64_t t = x.size(0), hd = x.size(1), half = hd / 2;
  at::Tensor out = at::empty_like(x);
  auto in = x.accessor<float, 2>();
  auto o = out.accessor<float, 2>();
  for (int64_t p = 0; p < t; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * i / hd);
      const double c = std::cos(angle), s = std::sin(angle);
      o[p][i] = static_cast<float>(in[p][i] * c - in[p][i + half] * s);
      o[p][i + half] = static_cast<float>(in[p][i + half] * c + in[p][i] * s);
    }
  return out;
}

at::Tensor reference_llama(const torch::nn::Module& m, const ModelSpec& s, const at::Tensor& ids) {
  at::NoGradGuard no_grad;
  auto P = [&](const std::string& n) { return param_of(m, n); };
  const int64_t d = s.d_model, hd = d / s.n_heads, group = s.n_heads / s.n_kv_heads;
  at::Tensor x = P("model.embed_tokens.weight").index_select(0, ids);
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    at::Tensor h = ref_rms_norm(x, P(b + "input_layernorm.weight"), s.norm_eps);
    at::Tensor q = h.mm(P(b + "self_attn.q_proj.weight").t());
    at::Tensor k = h.mm(P(b + "self_attn.k_proj.weight").t());
    at::Tensor v = h.mm(P(b + "self_attn.v_proj.weight").t());
    std::vector<at::Tensor> heads;
    for (int64_t i = 0; i < s.n_heads; ++i) {
      const int64_t kv = i / group;  // query heads i*group..: share kv head i/group
      heads.push_back(ref_head_attention(ref_rope(q.slice(1, i * hd, (i + 1) * hd).contiguous(), s.rope_theta),
                                         ref_rope(k.slice(1, kv * hd, (kv + 1) * hd).contiguous(), s.rope_theta),
                                         v.slice(1, kv * hd, (kv + 1) * hd), /*causal=*/true));
    }
    x = x + at::cat(heads, 1).mm(P(b + "self_attn.o_proj.weight").t());
    h = ref_rms_norm(x, P(b + "post_attention_layernorm.weight"), s.norm_eps);
    at::Tensor gate = h.mm(P(b + "mlp.gate_proj.weight").t());
    at::Tensor up = h.mm(P(b + "mlp.up_proj.weight").t());
    x = x + (gate * at::sigmoid(gate) * up).mm(P(b + "mlp.down_proj.weight").t());
  }
  x = ref_rms_norm(x, P("model.norm.weight"), s.norm_eps);
  return x.mm(P("lm_head.weight").t());
}

TEST(ModelLlama, HfNamesAndGqaShapes) {
  const ModelSpec spec = tiny_llama();
  auto model = build_model(spec, at::kMeta);
  EXPECT_EQ(model->spec().d_ff, 128);  // 8*32/3 = 85.3 -> 86 -> next multiple of 64
  auto shapes = shapes_of(*model);
  using V = std::vector<int64_t>;
  EXPECT_EQ(shapes.size(), 1u + 2u * 9u + 2u);
  EXPECT_EQ(shapes["model.embed_tokens.weight"], (V{41, 32}));
  EXPECT_EQ(shapes["model.norm.weight"], (V{32}));
  EXPECT_EQ(shapes["lm_head.weight"], (V{41, 32}));
  const std::string b = "model.layers.1.";
  EXPECT_EQ(shapes[b + "self_attn.q_proj.weight"], (V{32, 32}));
  EXPECT_EQ(shapes[b + "self_attn.k_proj.weight"], (V{16, 32}));  // 2 kv heads of 8
  EXPECT_EQ(shapes[b + "self_attn.v_proj.weight"], (V{16, 32}));
  EXPECT_EQ(shapes[b + "self_attn.o_proj.weight"], (V{32, 32}));
  EXPECT_EQ(shapes[b + "mlp.gate_proj.weight"], (V{128, 32}));
  EXPECT_EQ(shapes[b + "mlp.up_proj.weight"], (V{128, 32}));
  EXPECT_EQ(shapes[b + "mlp.down_proj.weight"], (V{32, 128}));
  EXPECT_EQ(shapes[b + "input_layernorm.weight"], (V{32}));
  EXPECT_EQ(shapes[b + "post_attention_layernorm.weight"], (V{32}));
  for (const auto& item : shapes) EXPECT_EQ(item.first.find("bias"), std::string::npos) << item.first;
  EXPECT_EQ(numel_of(*model), parameter_count(spec));
  EXPECT_EQ(model->named_modules()["model.layers.0"]->name(), model->block_types()[0]);
}

TEST(ModelLlama, TiedHeadHasNoParameterAndDefaultKvHeads) {
  ModelSpec spec = tiny_llama();
  spec.tie_embeddings = true;
  spec.n_kv_heads = 0;
  auto model = build_model(spec, at::kCPU);
  EXPECT_EQ(model->spec().n_kv_heads, 4);
  auto shapes = shapes_of(*model);
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u);
  EXPECT_EQ(shapes["model.layers.0.self_attn.k_proj.weight"], (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(numel_of(*model), parameter_count(spec));
  at::Tensor ids = at::randint(41, {2, 5}, at::TensorOptions().dtype(at::kLong));
  EXPECT_EQ(model->forward(ids).sizes().vec(), (std::vector<int64_t>{2, 5, 41}));
}

TEST(ModelLlama, Preset7bCountOnMeta) {
  const ModelSpec spec = preset_spec("llama-7b");
  EXPECT_EQ(parameter_count(spec), 6738415616);  // Llama-1 7B
  auto model = build_model(spec, at::kMeta);
  EXPECT_EQ(numel_of(*model), 6738415616);
}

TEST(ModelLlama, ForwardAndBackwardOnMeta) {
  auto model = build_model(tiny_llama(), at::kMeta);
  at::Tensor ids = at::zeros({2, 16}, at::TensorOptions().dtype(at::kLong).device(at::kMeta));
  at::Tensor logits = model->forward(ids);
  EXPECT_TRUE(logits.is_meta());
  EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{2, 16, 41}));
  model->loss(ids, ids).backward();
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_EQ(item.value().grad().sizes(), item.value().sizes());
  }
}

TEST(ModelLlama, MatchesHandWrittenReference) {
  const ModelSpec spec = tiny_llama();
  auto model = build_model(spec, at::kCPU);
  fill_random(*model, 5, 0.3);
  at::NoGradGuard no_grad;
  for (auto& item : model->named_parameters())  // norm weights around 1, as trained ones are
    if (item.key().find("norm") != std::string::npos) item.value().add_(1.0);
  at::Tensor ids = at::randint(spec.vocab_size, {2, 11}, at::TensorOptions().dtype(at::kLong));
  at::Tensor logits = model->forward(ids);
  EXPECT_GT(logits.std().item<double>(), 0.3);
  for (int64_t b = 0; b < 2; ++b) {
    at::Tensor ref = reference_llama(*model, spec, ids[b]);
    EXPECT_TRUE(at::allclose(logits[b], ref, 1e-4, 1e-4)) << (logits[b] - ref).abs().max().item<float>();
  }
}

TEST(ModelLlama, FutureTokensDoNotChangeEarlierLogits) {
  const ModelSpec spec = tiny_llama();
  auto model = build_model(spec, at::kCPU);
  fill_random(*model, 9, 0.3);
  at::Tensor ids = at::randint(spec.vocab_size, {1, 16}, at::TensorOptions().dtype(at::kLong));
  at::Tensor changed = ids.clone();
  changed[0][10] = (ids[0][10].item<int64_t>() + 3) % spec.vocab_size;
  at::Tensor a = model->forward(ids), b = model->forward(changed);
  EXPECT_TRUE(at::equal(a.slice(1, 0, 10), b.slice(1, 0, 10)));
  EXPECT_FALSE(at::allclose(a.slice(1, 10), b.slice(1, 10)));
}

TEST(ModelLlama, PackedRowsAreComputedAsIfAlone) {
  ModelSpec spec = tiny_llama();
  auto model = build_model(spec, at::kCPU);
  fill_random(*model, 21, 0.3);
  // Rows of 1 to 16 tokens, a window with padding, one filled by a single row.
  expect_rows_as_if_alone(*model, spec.vocab_size, 16, {{5, 9}, {3, 1, 7}, {16}}, 22);
  // On meta (the planner's probe): the same shapes.
  auto meta = build_model(spec, at::kMeta);
  Rows rows{at::zeros({1, 8}, at::TensorOptions().dtype(at::kLong).device(at::kMeta)), {0, 3, 8}};
  EXPECT_EQ(meta->forward(at::zeros({1, 8}, at::TensorOptions().dtype(at::kLong).device(at::kMeta)), rows).sizes().vec(),
            (std::vector<int64_t>{1, 8, spec.vocab_size}));
}

TEST(ModelLlama, ForwardReadsParametersSwappedIntoTheDicts) {
  const ModelSpec spec = tiny_llama();
  auto cpu = build_model(spec, at::kCPU);
  fill_random(*cpu, 13, 0.3);
  auto cpu_params = cpu->named_parameters();
  auto meta = build_model(spec, at::kMeta);
  const int64_t swapped = swap_parameters(*meta, [&](const std::string& name) {
    return cpu_params[name].detach().clone().requires_grad_(true);
  });
  EXPECT_EQ(swapped, static_cast<int64_t>(cpu_params.size()));
  at::Tensor ids = at::randint(spec.vocab_size, {2, 7}, at::TensorOptions().dtype(at::kLong));
  EXPECT_TRUE(at::allclose(meta->forward(ids), cpu->forward(ids)));
}

TEST(ModelLlama, Bf16ComputeWithFp32Norms) {
  const ModelSpec spec = tiny_llama();
  auto cpu = build_model(spec, at::kCPU);
  fill_random(*cpu, 17, 0.2);
  auto cpu_params = cpu->named_parameters();
  auto mixed = build_model(spec, at::kMeta);
  swap_parameters(*mixed, [&](const std::string& name) {
    at::Tensor p = cpu_params[name].detach();
    return name.find("norm") != std::string::npos ? p.clone() : p.to(at::kBFloat16);
  });
  at::Tensor ids = at::randint(spec.vocab_size, {2, 7}, at::TensorOptions().dtype(at::kLong));
  at::Tensor out = mixed->forward(ids);
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::allclose(out.to(at::kFloat), cpu->forward(ids), 0.05, 0.1));
}

TEST(ModelLlama, InitRulesAndFlops) {
  auto model = build_model(tiny_llama(), at::kMeta);
  EXPECT_EQ(model->init_for("model.layers.0.input_layernorm.weight").kind, ParamInit::Kind::Ones);
  EXPECT_EQ(model->init_for("model.norm.weight").kind, ParamInit::Kind::Ones);
  EXPECT_EQ(model->init_for("lm_head.weight").kind, ParamInit::Kind::Normal);
  for (const auto& item : model->named_parameters()) (void)model->init_for(item.key());
  const double n = static_cast<double>(parameter_count(tiny_llama()) - 41 * 32);
  EXPECT_DOUBLE_EQ(model->train_flops_per_token(16), 6.0 * n + 12.0 * 2 * 32 * 16);
}

TEST(ModelLlama, RejectsKvHeadsThatDoNotDivide) {
  ModelSpec spec = tiny_llama();
  spec.n_kv_heads = 3;
  EXPECT_THROW(build_model(spec, at::kMeta), UserError);
}

}  // namespace
}  // namespace shardtrain::model
