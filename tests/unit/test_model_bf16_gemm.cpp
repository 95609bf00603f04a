// The bf16 GEMM dispatch of the model layers (model/bf16_gemm.h): the fp32-operand path's
// forward and both backward products are fp32 GEMMs of the bf16 values rounded to bf16 once
// (checked bit for bit against that computed by hand), the native path is libtorch's own op bit
// for bit, the run-time check of libtorch's accumulation matches the kernel on this CPU, fp32
// tensors never change path, and Linear / Conv1D take the dispatch.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "shardtrain/model/bf16_gemm.h"
#include "shardtrain/model/layers.h"

using namespace shardtrain;

namespace {
struct PathGuard {  // restores the process-wide path after a test
  model::Bf16Gemm before = model::bf16_gemm();
  explicit PathGuard(model::Bf16Gemm g) { model::set_bf16_gemm(g); }
  ~PathGuard() { model::set_bf16_gemm(before); }
};
at::Tensor bf(at::IntArrayRef shape, int64_t seed) {
  at::manual_seed(seed);
  return (at::rand(shape) - 0.5).to(at::kBFloat16);
}
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(a.view(at::kShort), b.view(at::kShort));
}
}  // namespace

TEST(Bf16Gemm, Fp32OperandsIsFp32GemmOfTheBf16ValuesRoundedOnce) {
  PathGuard g(model::Bf16Gemm::Fp32Operands);
  const at::Tensor x0 = bf({3, 37, 64}, 1), w0 = bf({48, 64}, 2), b0 = bf({48}, 3), gy = bf({3, 37, 48}, 4);
  at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
  at::Tensor y = model::linear(x, w, b);
  y.backward(gy);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  // By hand: every product in fp32 on the bf16 values, one rounding to bf16.
  const at::Tensor xf = x0.reshape({-1, 64}).to(at::kFloat), wf = w0.to(at::kFloat), gf = gy.reshape({-1, 48}).to(at::kFloat);
  EXPECT_TRUE(same_bits(y, at::addmm(b0.to(at::kFloat), xf, wf.t()).to(at::kBFloat16).view({3, 37, 48})));
  EXPECT_TRUE(same_bits(x.grad(), at::mm(gf, wf).to(at::kBFloat16).view({3, 37, 64})));
  EXPECT_TRUE(same_bits(w.grad(), at::mm(gf.t(), xf).to(at::kBFloat16)));
  EXPECT_TRUE(same_bits(b.grad(), gf.sum(0).to(at::kBFloat16)));
}

// What the program guarantees of the native path on any CPU: it is libtorch's own bf16 op, forward
// and autograd, bit for bit. How that kernel rounds is libtorch's and the CPU's (fp32
// accumulation with AVX512_BF16 / AMX, partial sums in bf16 on AVX2-only CPUs): the program
// checks it at run time (bf16_native_accumulates_in_fp32) instead of assuming it.
TEST(Bf16Gemm, NativeIsLibtorchsOwnOp) {
  PathGuard g(model::Bf16Gemm::Native);
  const at::Tensor x0 = bf({4, 19, 96}, 5), w0 = bf({80, 96}, 6), b0 = bf({80}, 13), gy = bf({4, 19, 80}, 7);
  at::Tensor x[2], w[2], b[2], y[2];
  for (int p = 0; p < 2; ++p) {
    x[p] = x0.clone().requires_grad_(true);
    w[p] = w0.clone().requires_grad_(true);
    b[p] = b0.clone().requires_grad_(true);
    y[p] = p == 0 ? model::linear(x[p], w[p], b[p]) : at::linear(x[p], w[p], b[p]);
    y[p].backward(gy);
  }
  EXPECT_TRUE(same_bits(y[0], y[1]));
  EXPECT_TRUE(same_bits(x[0].grad(), x[1].grad()));
  EXPECT_TRUE(same_bits(w[0].grad(), w[1].grad()));
  EXPECT_TRUE(same_bits(b[0].grad(), b[1].grad()));
  const at::Tensor a = bf({6, 96}, 14), m = bf({96, 8}, 15), c = bf({8}, 16);
  EXPECT_TRUE(same_bits(model::addmm(c, a, m), at::addmm(c, a, m)));
}

// The run-time check tells the truth on this CPU, whichever it is: the two paths agree to one bf16
// rounding on other values exactly when the check says libtorch accumulates in fp32.
TEST(Bf16Gemm, NativeAccumulationCheckMatchesTheKernel) {
  const at::Tensor x0 = bf({64, 96}, 5), w0 = bf({80, 96}, 6), gy = bf({64, 80}, 7);
  at::Tensor y[2], gx[2], gw[2];
  for (int p = 0; p < 2; ++p) {
    PathGuard g(p == 0 ? model::Bf16Gemm::Native : model::Bf16Gemm::Fp32Operands);
    at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    y[p] = model::linear(x, w);
    y[p].backward(gy);
    gx[p] = x.grad();
    gw[p] = w.grad();
  }
  bool agree = true;
  for (auto* t : {y, gx, gw}) agree = agree && at::allclose(t[0].to(at::kFloat), t[1].to(at::kFloat), 1.0 / 128, 1e-3);
  EXPECT_EQ(agree, model::bf16_native_accumulates_in_fp32());
  EXPECT_EQ(model::bf16_gemm(), model::Bf16Gemm::Native);  // the check restores the path
  // The fp32-operand path is one rounding of the exact product on any CPU: within bf16's unit
  // roundoff (2^-8 relative: 8 significant bits) of the fp64 product, plus the fp32 sum's error.
  const at::Tensor exact = at::mm(x0.to(at::kDouble), w0.to(at::kDouble).t());
  EXPECT_TRUE(at::allclose(y[1].to(at::kDouble), exact, /*rtol=*/1.0 / 256 + 1e-6, /*atol=*/1e-5))
      << (y[1].to(at::kDouble) - exact).abs().max().item<double>();
}

TEST(Bf16Gemm, Fp32TensorsKeepLibtorchsPath) {
  PathGuard g(model::Bf16Gemm::Fp32Operands);
  at::manual_seed(8);
  const at::Tensor x = at::randn({5, 7, 16}), w = at::randn({9, 16}), b = at::randn({9});
  EXPECT_TRUE(at::equal(model::linear(x, w, b), at::linear(x, w, b)));
  const at::Tensor a = at::randn({6, 16}), m = at::randn({16, 4}), c = at::randn({4});
  EXPECT_TRUE(at::equal(model::addmm(c, a, m), at::addmm(c, a, m)));
}

TEST(Bf16Gemm, LayersTakeTheDispatch) {
  PathGuard g(model::Bf16Gemm::Fp32Operands);
  model::Conv1D conv(32, 24, at::kCPU);  // GPT-2's projection: weight [in, out]
  auto& dict = model::parameter_dict(conv);
  dict["weight"] = bf({32, 24}, 9);
  dict["bias"] = bf({24}, 10);
  const at::Tensor x = bf({2, 5, 32}, 11);
  const at::Tensor want = at::addmm(dict["bias"].to(at::kFloat), x.reshape({-1, 32}).to(at::kFloat),
                                    dict["weight"].to(at::kFloat)).to(at::kBFloat16).view({2, 5, 24});
  EXPECT_TRUE(same_bits(conv.forward(x), want));
  model::Linear lin(32, 24, false, at::kCPU);
  model::parameter_dict(lin)["weight"] = bf({24, 32}, 12);
  const at::Tensor wl = model::parameter_dict(lin)["weight"];
  EXPECT_TRUE(same_bits(lin.forward(x), at::mm(x.reshape({-1, 32}).to(at::kFloat), wl.to(at::kFloat).t())
                                            .to(at::kBFloat16).view({2, 5, 24})));
}

TEST(Bf16Gemm, CandidatesAreMeasured) {
  EXPECT_GT(model::bf16_gemm_gflops(model::Bf16Gemm::Native, 64, 64, 128, 1), 0);
  EXPECT_GT(model::bf16_gemm_gflops(model::Bf16Gemm::Fp32Operands, 64, 64, 128, 1), 0);
  EXPECT_EQ(model::bf16_gemm(), model::Bf16Gemm::Native);  // the measurement restores the path
}
