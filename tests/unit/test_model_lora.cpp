// LoRA and frozen parameters in the model layer (model/lora.h): names and shapes of the adapters,
// which parameters train, PEFT's init, the forward y = W x + b + s B A x on Linear (Llama) and on
// GPT-2's Conv1D, and the refusals (a target or pattern matching nothing, a rank above min(in,
// out), train_also without LoRA, nothing left to train); the glob rule of util/names.h.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "shardtrain/model/gpt2.h"
#include "shardtrain/model/llama.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/names.h"

namespace shardtrain::model {
namespace {

ModelSpec llama(int64_t rank, std::vector<std::string> targets) {
  ModelSpec s;
  s.arch = "llama";
  s.vocab_size = 41;
  s.seq_len = 16;
  s.d_model = 32;
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.tie_embeddings = false;
  s.finetune.lora.rank = rank;
  s.finetune.lora.alpha = 16;
  s.finetune.lora.targets = std::move(targets);
  return s;
}

std::string message_of(const ModelSpec& s) {
  try {
    build_model(s, at::kMeta);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Names, GlobsMatchWholeNamesOtherPatternsWhereTheyOccur) {
  EXPECT_TRUE(matches_any("model.layers.3.mlp.up_proj.weight", {"model.layers.[0-9].*"}));
  EXPECT_FALSE(matches_any("model.layers.13.mlp.up_proj.weight", {"model.layers.[0-9].*"}));
  EXPECT_TRUE(matches_any("model.layers.13.mlp.up_proj.weight", {"model.layers.1*"}));
  EXPECT_FALSE(matches_any("model.norm.weight", {"*.layers.*"}));
  EXPECT_TRUE(matches_any("model.layers.0.input_layernorm.weight", {"norm"}));  // a substring
  EXPECT_TRUE(matches_any("model.embed_tokens.weight", {"embed_tokens"}));
  EXPECT_FALSE(matches_any("model.embed_tokens.weight", {""}));
}

TEST(Lora, AdaptersOnTheTargetsOnlyTheyTrain) {
  std::shared_ptr<Model> m = build_model(llama(4, {"q_proj", "mlp.down_proj"}), at::kMeta);
  int adapters = 0;
  for (const auto& p : m->named_parameters()) {
    const std::string& n = p.key();
    const bool lora = is_lora_param(n);
    EXPECT_EQ(p.value().requires_grad(), lora) << n;
    if (!lora) continue;
    ++adapters;
    EXPECT_TRUE(n.find(".q_proj.lora_") != std::string::npos || n.find(".mlp.down_proj.lora_") != std::string::npos) << n;
    if (n == "model.layers.1.self_attn.q_proj.lora_A.weight") EXPECT_EQ(p.value().sizes(), at::IntArrayRef({4, 32}));
    if (n == "model.layers.1.self_attn.q_proj.lora_B.weight") EXPECT_EQ(p.value().sizes(), at::IntArrayRef({32, 4}));
    if (n == "model.layers.0.mlp.down_proj.lora_A.weight") EXPECT_EQ(p.value().size(1), m->spec().d_ff);
  }
  EXPECT_EQ(adapters, 2 * 2 * 2);  // 2 layers x 2 targets x (A, B)
  // all-linear: the seven linear layers of every block, never the LM head.
  std::shared_ptr<Model> all = build_model(llama(2, {"all-linear"}), at::kMeta);
  int n = 0;
  for (const auto& p : all->named_parameters()) n += is_lora_param(p.key());
  EXPECT_EQ(n, 2 * 7 * 2);
  EXPECT_EQ(all->named_parameters().find("lm_head.lora_A.weight"), nullptr);
}

TEST(Lora, PeftInitAndForward) {
  ModelSpec s = llama(4, {"all-linear"});
  s.finetune.lora.rslora = true;
  std::shared_ptr<Model> m = build_model(s, at::kCPU);  // init_parameters: PEFT's rule for the adapters
  const at::Tensor a = *m->named_parameters().find("model.layers.0.mlp.down_proj.lora_A.weight");
  const at::Tensor b = *m->named_parameters().find("model.layers.0.mlp.down_proj.lora_B.weight");
  const double bound = 1.0 / std::sqrt(static_cast<double>(a.size(1)));
  EXPECT_LE(a.abs().max().item<double>(), bound);
  EXPECT_GT(a.abs().max().item<double>(), 0.8 * bound);  // uniform over the whole range
  EXPECT_EQ(b.abs().max().item<double>(), 0.0);
  // A layer's forward is W x + s B A x with s = alpha / sqrt(r) (rslora).
  auto* layer = dynamic_cast<Linear*>(m->named_modules()["model.layers.1.self_attn.v_proj"].get());
  ASSERT_NE(layer, nullptr);
  at::NoGradGuard ng;
  at::Tensor bv = *m->named_parameters().find("model.layers.1.self_attn.v_proj.lora_B.weight");
  bv.normal_();
  const at::Tensor av = *m->named_parameters().find("model.layers.1.self_attn.v_proj.lora_A.weight");
  const at::Tensor w = *m->named_parameters().find("model.layers.1.self_attn.v_proj.weight");
  const at::Tensor x = at::randn({3, 5, 32});
  const at::Tensor want = at::matmul(x, w.t()) + at::matmul(at::matmul(x, av.t()), bv.t()) * (16.0 / 2.0);
  EXPECT_TRUE(at::allclose(layer->forward(x), want, 1e-5, 1e-5));
}

TEST(Lora, Gpt2Conv1DBranchIsLinearsAndFrozenBaseStillGetsInputGradients) {
  ModelSpec s;
  s.arch = "gpt2";
  s.vocab_size = 37;
  s.seq_len = 8;
  s.d_model = 16;
  s.n_layers = 1;
  s.n_heads = 2;
  s.finetune.lora.rank = 2;
  s.finetune.lora.targets = {"c_attn", "c_fc"};
  s.finetune.train_also = {"ln_f"};
  std::shared_ptr<Model> m = build_model(s, at::kCPU);
  auto* c = dynamic_cast<Conv1D*>(m->named_modules()["transformer.h.0.attn.c_attn"].get());
  ASSERT_NE(c, nullptr);
  at::Tensor bt = *m->named_parameters().find("transformer.h.0.attn.c_attn.lora_B.weight");
  {
    at::NoGradGuard ng;
    bt.normal_();
  }
  const at::Tensor at_ = *m->named_parameters().find("transformer.h.0.attn.c_attn.lora_A.weight");
  const at::Tensor w = *m->named_parameters().find("transformer.h.0.attn.c_attn.weight");  // [in, out]
  const at::Tensor bias = *m->named_parameters().find("transformer.h.0.attn.c_attn.bias");
  const at::Tensor x = at::randn({2, 3, 16});
  const at::Tensor want = at::matmul(x, w) + bias + at::matmul(at::matmul(x, at_.t()), bt.t()) * (8.0 / 2.0);
  EXPECT_TRUE(at::allclose(c->forward(x).detach(), want.detach(), 1e-5, 1e-5));
  // Training: gradients reach the adapters and train_also only.
  const at::Tensor ids = at::randint(37, {2, 8}, at::kLong);
  m->loss(ids, ids).backward();
  for (const auto& p : m->named_parameters()) {
    const bool trains = is_lora_param(p.key()) || p.key().rfind("transformer.ln_f.", 0) == 0;
    EXPECT_EQ(p.value().grad().defined(), trains) << p.key();
  }
  // The c_attn adapter's A gets a gradient through B (non-zero), c_fc's A none yet (B = 0).
  EXPECT_GT(m->named_parameters().find("transformer.h.0.attn.c_attn.lora_A.weight")->grad().abs().max().item<double>(), 0);
}

TEST(Lora, Refusals) {
  EXPECT_NE(message_of(llama(4, {"qproj"})).find("lora.targets: \"qproj\" matches no linear layer"), std::string::npos);
  EXPECT_NE(message_of(llama(4, {"qproj"})).find("q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"),
            std::string::npos);
  EXPECT_NE(message_of(llama(17, {"k_proj"})).find("lora.rank = 17 is above min(in, out) = 16"), std::string::npos);
  EXPECT_EQ(message_of(llama(16, {"k_proj"})), "");
  ModelSpec also = llama(0, {});
  also.finetune.train_also = {"norm"};
  EXPECT_NE(message_of(also).find("lora.train_also"), std::string::npos);
  ModelSpec freeze = llama(0, {});
  freeze.finetune.freeze = {"model.layerz.*"};
  EXPECT_NE(message_of(freeze).find("train.freeze: \"model.layerz.*\" matches no parameter"), std::string::npos);
  freeze.finetune.freeze = {"*"};
  EXPECT_NE(message_of(freeze).find("nothing would train"), std::string::npos);
  freeze.finetune.freeze = {"model.embed_tokens.*", "model.layers.0.*"};
  std::shared_ptr<Model> m = build_model(freeze, at::kMeta);
  EXPECT_FALSE(m->named_parameters().find("model.layers.0.mlp.up_proj.weight")->requires_grad());
  EXPECT_TRUE(m->named_parameters().find("model.layers.1.mlp.up_proj.weight")->requires_grad());
}

}  // namespace
}  // namespace shardtrain::model
