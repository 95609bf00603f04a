// The bf16 GEMM dispatch of the models' linear layers (see bf16_gemm.h): libtorch's bf16
// matmul, or an autograd function that runs fp32 GEMMs on the bf16 operands.
#include "shardtrain/model/bf16_gemm.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <chrono>

namespace shardtrain::model {
namespace {
std::atomic<Bf16Gemm> g_path{Bf16Gemm::Native};

// a b (+ bias) in fp32 on bf16 inputs, rounded to bf16 once; saves the bf16 inputs (the same
// bytes as libtorch's bf16 addmm saves) and converts them again in backward. libtorch 1.13's
// custom functions take no undefined tensor, so the bias-free product is its own function.
at::Tensor fp32_product(const at::Tensor* bias, const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor y = bias ? at::addmm(bias->to(at::kFloat), a.to(at::kFloat), b.to(at::kFloat))
                            : at::mm(a.to(at::kFloat), b.to(at::kFloat));
  return y.to(a.scalar_type());
}
// Gradients of a b: {da, db} (undefined where not needed), and the fp32 upstream gradient.
void fp32_product_grads(torch::autograd::AutogradContext* ctx, const at::Tensor& gy, int a_index, at::Tensor& ga,
                        at::Tensor& gb, at::Tensor& g) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor& a = saved[0];
  const at::Tensor& b = saved[1];
  g = gy.to(at::kFloat);
  if (ctx->needs_input_grad(a_index)) ga = at::mm(g, b.to(at::kFloat).t()).to(a.scalar_type());
  if (ctx->needs_input_grad(a_index + 1)) gb = at::mm(a.to(at::kFloat).t(), g).to(b.scalar_type());
}

struct Fp32OperandsMm : torch::autograd::Function<Fp32OperandsMm> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    return fp32_product(nullptr, a, b);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    at::Tensor ga, gb, g;
    fp32_product_grads(ctx, grads[0], 0, ga, gb, g);
    return {ga, gb};
  }
};

struct Fp32OperandsAddmm : torch::autograd::Function<Fp32OperandsAddmm> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& bias, const at::Tensor& a,
                            const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.scalar_type());
    return fp32_product(&bias, a, b);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    at::Tensor ga, gb, g, gbias;
    fp32_product_grads(ctx, grads[0], 1, ga, gb, g);
    if (ctx->needs_input_grad(0))
      gbias = g.sum(0).to(static_cast<at::ScalarType>(ctx->saved_data["bias_dtype"].toInt()));
    return {gbias, ga, gb};
  }
};

at::Tensor fp32_operands(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b) {
  return bias.defined() ? Fp32OperandsAddmm::apply(bias, a, b) : Fp32OperandsMm::apply(a, b);
}

bool use_fp32_operands(const at::Tensor& a, const at::Tensor& b) {
  return g_path.load(std::memory_order_relaxed) == Bf16Gemm::Fp32Operands && a.scalar_type() == at::kBFloat16 &&
         b.scalar_type() == at::kBFloat16 && a.device().is_cpu() && b.device().is_cpu();
}
}  // namespace

const char* to_string(Bf16Gemm g) { return g == Bf16Gemm::Native ? "bf16" : "fp32"; }
void set_bf16_gemm(Bf16Gemm g) { g_path.store(g); }
Bf16Gemm bf16_gemm() { return g_path.load(); }

at::Tensor addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b) {
  if (use_fp32_operands(a, b)) return fp32_operands(bias, a, b);
  return bias.defined() ? at::addmm(bias, a, b) : at::mm(a, b);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (!use_fp32_operands(x, w)) return bias.defined() ? at::linear(x, w, bias) : at::linear(x, w);
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = w.size(0);
  return fp32_operands(bias, x.reshape({-1, x.size(-1)}), w.t()).view(out_shape);
}

double bf16_gemm_gflops(Bf16Gemm g, int64_t tokens, int64_t in, int64_t out, int reps) {
  const Bf16Gemm before = bf16_gemm();
  set_bf16_gemm(g);
  at::Tensor x = (at::rand({tokens, in}) - 0.5).to(at::kBFloat16).requires_grad_(true);
  at::Tensor w = (at::rand({out, in}) * 0.1 - 0.05).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor gy = (at::rand({tokens, out}) - 0.5).to(at::kBFloat16);
  double best = 0;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    model::linear(x, w).backward(gy);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::max(best, 3 * 2.0 * tokens * in * out / s / 1e9);
    x.mutable_grad() = at::Tensor();
    w.mutable_grad() = at::Tensor();
  }
  set_bf16_gemm(before);
  return best;
}

bool bf16_native_accumulates_in_fp32() {
  const Bf16Gemm before = bf16_gemm();
  // Fixed values from a generator of its own: the answer does not depend on the caller's seed.
  at::Generator gen = at::detail::createCPUGenerator(/*seed_in=*/20261207);
  auto value = [&](at::IntArrayRef shape) { return (at::rand(shape, gen) - 0.5).to(at::kBFloat16); };
  const at::Tensor x0 = value({64, 96}), w0 = value({80, 96}), gy = value({64, 80});
  at::Tensor out[2][3];
  for (int p = 0; p < 2; ++p) {
    set_bf16_gemm(p == 0 ? Bf16Gemm::Native : Bf16Gemm::Fp32Operands);
    at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    at::Tensor y = model::linear(x, w);
    y.backward(gy);
    out[p][0] = y.detach();
    out[p][1] = x.grad();
    out[p][2] = w.grad();
  }
  set_bf16_gemm(before);
  bool agree = true;
  for (int i = 0; i < 3; ++i)
    agree = agree && at::allclose(out[0][i].to(at::kFloat), out[1][i].to(at::kFloat), /*rtol=*/1.0 / 128, /*atol=*/1e-3);
  return agree;
}

}  // namespace shardtrain::model
