// A tiny pre-norm transformer LM for engine tests: hookable blocks, parameters read from
// the module dicts at forward time, mixed-precision-safe casts, built on any device.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cmath>
#include <functional>
#include <string>

#include "shardtrain/fsdp/forward_hook.h"

namespace tiny {

struct Config {
  int64_t vocab = 61, d = 24, heads = 2, layers = 3, seq = 8;
};

// Parameters of a module by local name (the dict entry the engine may have replaced).
inline at::Tensor P(const torch::nn::Module& m, const std::string& name) {
  return *m.named_parameters(false).find(name);
}
inline at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return at::linear(x.to(w.scalar_type()), w, b.defined() ? b.to(w.scalar_type()) : b);
}
inline at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return at::layer_norm(x.to(at::kFloat), {x.size(-1)}, w.to(at::kFloat), b.to(at::kFloat), 1e-5)
      .to(x.scalar_type());
}

// No qkv bias: the key bias has an exactly-zero gradient (softmax shift invariance), which
// Adam would turn into rounding-noise steps and make the equivalence check meaningless.
struct Block : torch::nn::Module, shardtrain::fsdp::Hookable {
  Config c;
  Block(const Config& cfg, at::Device dev) : c(cfg) {
    auto o = at::TensorOptions().device(dev).dtype(at::kFloat);
    register_parameter("ln_1_weight", at::empty({c.d}, o));
    register_parameter("ln_1_bias", at::empty({c.d}, o));
    register_parameter("attn_qkv_weight", at::empty({3 * c.d, c.d}, o));
    register_parameter("attn_proj_weight", at::empty({c.d, c.d}, o));
    register_parameter("attn_proj_bias", at::empty({c.d}, o));
    register_parameter("ln_2_weight", at::empty({c.d}, o));
    register_parameter("ln_2_bias", at::empty({c.d}, o));
    register_parameter("mlp_fc_weight", at::empty({4 * c.d, c.d}, o));
    register_parameter("mlp_fc_bias", at::empty({4 * c.d}, o));
    register_parameter("mlp_proj_weight", at::empty({c.d, 4 * c.d}, o));
    register_parameter("mlp_proj_bias", at::empty({c.d}, o));
  }
  at::Tensor forward(const at::Tensor& input) {
    return hooked(input, [this](const at::Tensor& x) {
      const int64_t B = x.size(0), T = x.size(1), H = c.heads, hd = c.d / H;
      at::Tensor h = layer_norm(x, P(*this, "ln_1_weight"), P(*this, "ln_1_bias"));
      at::Tensor qkv = linear(h, P(*this, "attn_qkv_weight"), at::Tensor());
      auto parts = qkv.split(c.d, -1);
      auto heads = [&](const at::Tensor& t) { return t.view({B, T, H, hd}).transpose(1, 2); };
      at::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
      at::Tensor att = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
      at::Tensor mask = at::ones({T, T}, at::TensorOptions().dtype(at::kBool).device(x.device())).triu(1);
      att = at::softmax(att.masked_fill(mask, -1e9).to(at::kFloat), -1).to(q.scalar_type());
      at::Tensor y = at::matmul(att, v).transpose(1, 2).reshape({B, T, c.d});
      at::Tensor r = x + linear(y, P(*this, "attn_proj_weight"), P(*this, "attn_proj_bias")).to(x.scalar_type());
      at::Tensor m = linear(layer_norm(r, P(*this, "ln_2_weight"), P(*this, "ln_2_bias")),
                            P(*this, "mlp_fc_weight"), P(*this, "mlp_fc_bias"));
      m = linear(at::gelu(m, "tanh"), P(*this, "mlp_proj_weight"), P(*this, "mlp_proj_bias"));
      return r + m.to(r.scalar_type());
    });
  }
};

struct Model : torch::nn::Module, shardtrain::fsdp::Hookable {
  Config c;
  std::vector<std::shared_ptr<Block>> blocks;
  Model(const Config& cfg, at::Device dev) : c(cfg) {
    auto o = at::TensorOptions().device(dev).dtype(at::kFloat);
    register_parameter("wte_weight", at::empty({c.vocab, c.d}, o));
    register_parameter("wpe_weight", at::empty({c.seq, c.d}, o));
    for (int64_t i = 0; i < c.layers; ++i)
      blocks.push_back(register_module("h" + std::to_string(i), std::make_shared<Block>(c, dev)));
    register_parameter("ln_f_weight", at::empty({c.d}, o));
    register_parameter("ln_f_bias", at::empty({c.d}, o));
  }
  // tokens [B,T] -> logits [B,T,V] (fp32); the output head is tied to wte.
  at::Tensor forward(const at::Tensor& tokens) {
    return hooked(tokens, [this](const at::Tensor& ids) {
      at::Tensor wte = P(*this, "wte_weight");
      at::Tensor pos = at::arange(ids.size(1), ids.options());
      at::Tensor x = at::embedding(wte, ids) + at::embedding(P(*this, "wpe_weight"), pos).to(wte.scalar_type());
      for (auto& b : blocks) x = b->forward(x);
      x = layer_norm(x, P(*this, "ln_f_weight"), P(*this, "ln_f_bias"));
      return at::matmul(x.to(wte.scalar_type()), wte.t()).to(at::kFloat);
    });
  }
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets) {
    at::Tensor logits = forward(tokens);
    return at::cross_entropy_loss(logits.view({-1, c.vocab}), targets.reshape({-1}));
  }
};

// Deterministic init by parameter name (the same on any world size).
inline void init_param(const std::string& name, at::Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(h);
  if (name.find("ln") != std::string::npos && name.find("weight") != std::string::npos)
    t.fill_(1.0).add_(at::normal(0.0, 0.1, t.sizes(), gen));
  else if (name.find("bias") != std::string::npos)
    t.normal_(0.0, 0.02, gen);
  else
    t.normal_(0.0, 0.2, gen);
}

}  // namespace tiny
