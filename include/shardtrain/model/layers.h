// Layers shared by the models (Linear, GPT-2 Conv1D, LayerNorm, RMSNorm, Embedding, attention)
// and the accessors through which parameters are read and swapped in a module's parameter dict.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/model/rows.h"

namespace shardtrain::model {

using ParamDict = torch::OrderedDict<std::string, at::Tensor>;

// The module's own (non-recursive) parameter dict, writable. The FSDP engine assigns
// `parameter_dict(m)[name] = view_of_flat_buffer`; every forward below reads the dict
// again, so the swap takes effect without rebuilding the module.
ParamDict& parameter_dict(torch::nn::Module& module);
const ParamDict& parameter_dict(const torch::nn::Module& module);

// The parameter `name` of `module` as its dict holds it now. Throws when absent.
const at::Tensor& dict_param(const torch::nn::Module& module, const std::string& name);

// Registers a parameter of `shape` directly on `device` (meta included) in fp32. The
// values are uninitialised: the engine (or init_parameters) fills them by init_for().
at::Tensor& add_param(torch::nn::Module& module, const std::string& name,
                      std::vector<int64_t> shape, c10::Device device);

// Base of the leaf layers: parameters live in the dict only, read back with param().
class ParamModule : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;

 protected:
  const at::Tensor& param(const std::string& name) const { return dict_param(*this, name); }
};

// LoRA's low-rank branch on a linear layer, as Hugging Face PEFT's lora.Linear computes it:
// y + s * B(A(dropout(x))), A [r, in] and B [out, r] registered on the layer as the submodules
// lora_A and lora_B, each holding a "weight", so their names are PEFT's
// (<layer>.lora_A.weight, <layer>.lora_B.weight). Off until attached.
class LoraBranch {
 public:
  void attach(torch::nn::Module& layer, int64_t in, int64_t out, int64_t rank, double scale, double dropout,
              c10::Device device);
  bool on() const { return a_ != nullptr; }
  at::Tensor add_to(const at::Tensor& y, const at::Tensor& x, bool training) const;

 private:
  std::shared_ptr<torch::nn::Module> a_, b_;
  double scale_ = 0, dropout_ = 0;
};

// What LoRA needs of a linear layer: its sizes and where to attach the branch.
class LinearLayer : public ParamModule {
 public:
  LinearLayer(int64_t in_features, int64_t out_features) : in_(in_features), out_(out_features) {}
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  void add_lora(int64_t rank, double scale, double dropout);
  bool has_lora() const { return lora_.on(); }

 protected:
  at::Tensor with_lora(const at::Tensor& y, const at::Tensor& x) const {
    return lora_.on() ? lora_.add_to(y, x, is_training()) : y;
  }

 private:
  int64_t in_, out_;
  LoraBranch lora_;
};

// y = x W^T + b, weight [out, in] (torch.nn.Linear layout).
class Linear : public LinearLayer {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, c10::Device device);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  bool has_bias_;
};

// GPT-2's Conv1D: y = x W + b, weight [in, out] (the transpose of Linear's layout). Its LoRA
// branch is Linear's (PEFT's fan_in_fan_out: A [r, in], B [out, r]); merged, B A is transposed.
class Conv1D : public LinearLayer {
 public:
  Conv1D(int64_t in_features, int64_t out_features, c10::Device device);
  at::Tensor forward(const at::Tensor& x) const;
};

// LayerNorm over the last dimension with weight and bias. Computes in the parameters'
// dtype when it differs from the input's (fp32 norms under mixed precision) and returns
// the input's dtype.
class LayerNorm : public ParamModule {
 public:
  LayerNorm(int64_t dim, double eps, c10::Device device);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  int64_t dim_;
  double eps_;
};

// RMSNorm as in HF Llama: x / sqrt(mean(x^2) + eps) in fp32, cast back, times weight.
class RMSNorm : public ParamModule {
 public:
  RMSNorm(int64_t dim, double eps, c10::Device device);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  double eps_;
};

// Token lookup table, weight [num, dim].
class Embedding : public ParamModule {
 public:
  Embedding(int64_t num, int64_t dim, c10::Device device);
  at::Tensor forward(const at::Tensor& ids) const;
  const at::Tensor& weight() const { return param("weight"); }
};

// Whether attention() runs the fused kernels (flash / memory-efficient, at::scaled_dot_product_attention)
// on a CUDA (cuda = true) or CPU tensor with this build's libtorch: on CUDA with libtorch >= 2.
// The memory planner's costs follow the same rule (CostQuery::fused_attention).
bool attention_is_fused(bool cuda);

// Scaled dot-product attention, q [B, H, T, hd], k/v [B, H, S, hd] -> [B, H, T, hd];
// scores scaled by 1/sqrt(hd), softmax in fp32, dropout on the probabilities.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                     double dropout, bool training);
// Causal attention inside each row of `rows` only (S == T). CPU (and CUDA without the fused
// kernels): attention() on each row's own block, sum of L_i^2 work and score memory, the same
// values as the row alone. CUDA with libtorch >= 2: the fused kernel with a block-diagonal
// causal mask (at::scaled_dot_product_attention's attn_mask). Empty rows: attention(causal).
at::Tensor row_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Rows& rows,
                         double dropout, bool training);

// [B, T, H*hd] <-> [B, H, T, hd].
at::Tensor split_heads(const at::Tensor& x, int64_t n_heads);
at::Tensor merge_heads(const at::Tensor& x);

// Dropout that is free when off (p == 0 or eval mode).
at::Tensor maybe_dropout(const at::Tensor& x, double p, bool training);

}  // namespace shardtrain::model
