// Helpers shared by the model tests: shape listings, parameter swapping through the
// dict (what the FSDP engine does), deterministic fills and hand-written reference ops.
#pragma once
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "shardtrain/model/layers.h"
#include "shardtrain/model/model.h"

namespace shardtrain::model::testing {

inline std::map<std::string, std::vector<int64_t>> shapes_of(const torch::nn::Module& m) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& item : m.named_parameters()) out[item.key()] = item.value().sizes().vec();
  return out;
}

inline int64_t numel_of(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// Replaces every parameter of every module of `target` in its own dict by the tensor
// `make(qualified_name)`, as the engine swaps meta parameters for flat-buffer views.
// Returns the number of parameters replaced.
template <typename Make>
int64_t swap_parameters(torch::nn::Module& target, Make make) {
  int64_t swapped = 0;
  for (auto& item : target.named_modules("", /*include_self=*/true)) {
    ParamDict& dict = parameter_dict(*item.value());
    for (auto& entry : dict) {
      const std::string name = item.key().empty() ? entry.key() : item.key() + "." + entry.key();
      entry.value() = make(name);
      ++swapped;
    }
  }
  return swapped;
}

// Overwrites every parameter with normal(mean, std) drawn from `seed`, so that norms and
// biases are not the trivial ones/zeros and a reference comparison sees every parameter.
inline void fill_random(torch::nn::Module& m, uint64_t seed, double std, double mean = 0.0) {
  at::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& p : m.parameters()) p.normal_(mean, std, gen);
}

inline at::Tensor param_of(const torch::nn::Module& m, const std::string& name) {
  const at::Tensor* p = m.named_parameters().find(name);
  EXPECT_NE(p, nullptr) << name;
  return p ? *p : at::Tensor();
}

// ---- reference ops written from the formulas, for one sequence x [T, d] ----

inline at::Tensor ref_layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps) {
  at::Tensor mean = x.mean({-1}, true);
  at::Tensor var = (x - mean).pow(2).mean({-1}, true);
  return (x - mean) / (var + eps).sqrt() * w + b;
}

inline at::Tensor ref_gelu_tanh(const at::Tensor& x) {
  return 0.5 * x * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x.pow(3))));
}

inline at::Tensor ref_gelu_erf(const at::Tensor& x) { return 0.5 * x * (1.0 + at::erf(x / std::sqrt(2.0))); }

// Softmax attention of one head: q [T, hd], k/v [S, hd]; masked entries get -1e30.
inline at::Tensor ref_head_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  const int64_t t = q.size(0), s = k.size(0);
  at::Tensor scores = q.mm(k.t()) / std::sqrt(static_cast<double>(q.size(1)));
  if (causal) {
    at::Tensor mask = at::zeros({t, s});
    auto acc = mask.accessor<float, 2>();
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = i + 1; j < s; ++j) acc[i][j] = -1e30f;
    scores = scores + mask;
  }
  at::Tensor e = (scores - std::get<0>(scores.max(1, true))).exp();
  return (e / e.sum(1, true)).mm(v);
}

}  // namespace shardtrain::model::testing
