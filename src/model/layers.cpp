// Layers shared by the models and the parameter-dict accessors (see layers.h).
#include "shardtrain/model/layers.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "shardtrain/util/error.h"
#include "shardtrain/util/torch_compat.h"

namespace shardtrain::model {

namespace {
// Module::parameters_ is protected; a pointer to it formed inside a derived class is a
// `ParamDict Module::*` and may be applied to any Module (standard C++, no casts).
struct DictAccess : torch::nn::Module {
  static ParamDict torch::nn::Module::*member() { return &DictAccess::parameters_; }
};
}  // namespace

ParamDict& parameter_dict(torch::nn::Module& module) { return module.*DictAccess::member(); }
const ParamDict& parameter_dict(const torch::nn::Module& module) {
  return module.*DictAccess::member();
}

const at::Tensor& dict_param(const torch::nn::Module& module, const std::string& name) {
  const at::Tensor* found = parameter_dict(module).find(name);
  ST_CHECK(found != nullptr, "module ", module.name(), " has no parameter '", name, "'");
  return *found;
}

at::Tensor& add_param(torch::nn::Module& module, const std::string& name,
                      std::vector<int64_t> shape, c10::Device device) {
  return module.register_parameter(
      name, at::empty(shape, at::TensorOptions().device(device).dtype(at::kFloat)));
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, c10::Device device)
    : has_bias_(bias) {
  add_param(*this, "weight", {out_features, in_features}, device);
  if (bias) add_param(*this, "bias", {out_features}, device);
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  if (has_bias_) return at::linear(x, param("weight"), param("bias"));
  return at::linear(x, param("weight"));
}

Conv1D::Conv1D(int64_t in_features, int64_t out_features, c10::Device device) {
  add_param(*this, "weight", {in_features, out_features}, device);
  add_param(*this, "bias", {out_features}, device);
}

at::Tensor Conv1D::forward(const at::Tensor& x) const {
  const at::Tensor& w = param("weight");
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = w.size(1);
  return at::addmm(param("bias"), x.reshape({-1, w.size(0)}), w).view(out_shape);
}

LayerNorm::LayerNorm(int64_t dim, double eps, c10::Device device) : dim_(dim), eps_(eps) {
  add_param(*this, "weight", {dim}, device);
  add_param(*this, "bias", {dim}, device);
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const {
  const at::Tensor& w = param("weight");
  const at::Tensor& b = param("bias");
  if (x.is_meta() || w.is_meta()) {
    // libtorch 1.13 lowers layer_norm on meta to batch_norm, which has no meta kernel;
    // the elementwise formula has the same shapes and autograd graph.
    at::Tensor centered = x - x.mean({-1}, /*keepdim=*/true);
    at::Tensor var = centered.pow(2).mean({-1}, /*keepdim=*/true);
    return centered * at::rsqrt(var + eps_) * w.to(x.scalar_type()) + b.to(x.scalar_type());
  }
  if (w.scalar_type() == x.scalar_type()) return at::layer_norm(x, {dim_}, w, b, eps_);
  return at::layer_norm(x.to(w.scalar_type()), {dim_}, w, b, eps_).to(x.scalar_type());
}

RMSNorm::RMSNorm(int64_t dim, double eps, c10::Device device) : eps_(eps) {
  add_param(*this, "weight", {dim}, device);
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean({-1}, /*keepdim=*/true) + eps_);
  return h.to(x.scalar_type()) * param("weight").to(x.scalar_type());
}

Embedding::Embedding(int64_t num, int64_t dim, c10::Device device) {
  add_param(*this, "weight", {num, dim}, device);
}

at::Tensor Embedding::forward(const at::Tensor& ids) const {
  const at::Tensor& w = weight();
  if (w.is_meta() || ids.is_meta()) {
    // libtorch 1.13 has no meta index_select; a lookup is one_hot(ids) @ weight, which
    // gives the same shapes and a [num, dim] gradient, and costs nothing on meta.
    std::vector<int64_t> one_hot_shape(ids.sizes().begin(), ids.sizes().end());
    one_hot_shape.push_back(w.size(0));
    return at::matmul(at::empty(one_hot_shape, w.options().device(at::kMeta)), w.to(at::kMeta));
  }
  return at::embedding(w, ids);
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                     double dropout, bool training) {
  // On CUDA with libtorch 2.x: the fused kernels (flash / memory-efficient), which never build
  // the [T, S] score matrix. CPU keeps the explicit form below, so CPU results do not depend on
  // the libtorch version.
  if (torch_compat::has_fused_attention() && q.is_cuda() && (!causal || q.size(-2) == k.size(-2))) {
    at::Tensor y = torch_compat::fused_attention(q, k, v, causal, training ? dropout : 0.0);
    if (y.defined()) return y;
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  if (causal) {
    const int64_t t = q.size(-2), s = k.size(-2);
    // Query i sees keys j <= i + (s - t): the usual lower triangle when s == t.
    at::Tensor future = at::ones({t, s}, q.options().dtype(at::kBool)).triu(s - t + 1);
    scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  }
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  probs = maybe_dropout(probs, dropout, training);
  return at::matmul(probs, v);
}

at::Tensor split_heads(const at::Tensor& x, int64_t n_heads) {
  const int64_t b = x.size(0), t = x.size(1), width = x.size(2);
  return x.view({b, t, n_heads, width / n_heads}).transpose(1, 2);
}

at::Tensor merge_heads(const at::Tensor& x) {
  const int64_t b = x.size(0), h = x.size(1), t = x.size(2), hd = x.size(3);
  return x.transpose(1, 2).reshape({b, t, h * hd});
}

at::Tensor maybe_dropout(const at::Tensor& x, double p, bool training) {
  if (!training || p <= 0.0) return x;
  return at::dropout(x, p, /*train=*/true);
}

}  // namespace shardtrain::model
