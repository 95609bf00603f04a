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

// Rows packed apart (model/rows.h): windows of `T` tokens holding rows of the given lengths
// (each window's rows in order from position 0, the rest padding) computed in one forward equal
// each row computed alone ([1, L]): logits, and the gradients of the summed losses (the last
// token of a row predicts nothing). fp32: the GEMMs see other row counts, so not bit for bit.
inline void expect_rows_as_if_alone(Model& model, int64_t vocab, int64_t T,
                                    const std::vector<std::vector<int64_t>>& windows, uint64_t seed) {
  at::manual_seed(seed);
  const int64_t B = static_cast<int64_t>(windows.size());
  at::Tensor ids = at::zeros({B, T}, at::kLong), targets = at::full({B, T}, -100, at::kLong);
  at::Tensor pos = at::zeros({B, T}, at::kLong);
  Rows rows;
  rows.cu_seqlens = {0};
  struct Row { int64_t b, start, len; };
  std::vector<Row> all;
  for (int64_t b = 0; b < B; ++b) {
    int64_t at = 0;
    for (int64_t len : windows[b]) {
      ids[b].narrow(0, at, len).copy_(at::randint(vocab, {len}, at::kLong));
      for (int64_t t = 0; t < len; ++t) pos[b][at + t] = t;
      if (len > 1) targets[b].narrow(0, at, len - 1).copy_(ids[b].narrow(0, at + 1, len - 1));
      all.push_back({b, at, len});
      at += len;
      rows.cu_seqlens.push_back(b * T + at);
    }
    if (at < T) {
      for (int64_t t = at; t < T; ++t) pos[b][t] = t - at;
      rows.cu_seqlens.push_back(b * T + T);
    }
  }
  rows.positions = pos;
  model.zero_grad();
  const at::Tensor packed = model.forward(ids, rows);
  model.loss_sum(ids, targets, rows).backward();
  std::map<std::string, at::Tensor> packed_grads;
  for (const auto& p : model.named_parameters()) packed_grads[p.key()] = p.value().grad().clone();
  model.zero_grad();
  for (const Row& r : all) {
    const at::Tensor one = ids[r.b].narrow(0, r.start, r.len).unsqueeze(0);
    const at::Tensor alone = model.forward(one);
    const at::Tensor got = packed[r.b].narrow(0, r.start, r.len).unsqueeze(0);
    EXPECT_TRUE(at::allclose(got, alone, 1e-5, 1e-5)) << "row of " << r.len << " at " << r.b << ":" << r.start << ": "
                                                      << (got - alone).abs().max().item<float>();
    model.loss_sum(one, targets[r.b].narrow(0, r.start, r.len).unsqueeze(0)).backward();
  }
  for (const auto& p : model.named_parameters()) {
    const at::Tensor& want = p.value().grad();
    EXPECT_TRUE(at::allclose(packed_grads[p.key()], want, 1e-4, 1e-5))
        << p.key() << ": " << (packed_grads[p.key()] - want).abs().max().item<float>();
  }
  // Without rows the same windows attend across rows: the rows are not computed alone.
  EXPECT_FALSE(at::allclose(model.forward(ids), packed, 1e-3, 1e-3));
}

}  // namespace shardtrain::model::testing
