// The bf16 GEMM path of the models' linear layers on a CPU (issue #15, docs/performance.md):
// libtorch's own bf16 matmul (oneDNN inside: AMX where the CPU has it) or an fp32 GEMM on the
// bf16 operands. The product of two bf16 values is exact in fp32, so the second is bf16
// compute with fp32 accumulation like the first, differing only in summation order; inputs,
// saved tensors, outputs and gradients stay bf16 either way (results rounded to bf16 once).
// The path is one process-wide setting, chosen at start-up (train/bf16_choice.h) and the same
// on every rank; fp32 tensors always take libtorch's fp32 path.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

namespace shardtrain::model {

enum class Bf16Gemm { Native, Fp32Operands };
const char* to_string(Bf16Gemm g);  // "bf16" | "fp32"

void set_bf16_gemm(Bf16Gemm g);
Bf16Gemm bf16_gemm();

// y = bias + a b (a [n, k], b [k, m]; bias [m] or undefined), with autograd, by the chosen
// path when a and b are bf16 CPU tensors (the meta device and fp32: libtorch's own op).
at::Tensor addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b);
// y = x w^T + bias over x's last dimension (at::linear), by the same dispatch.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {});

// GFLOP/s of one candidate at one linear layer's three products (forward Y = X Wᵀ, backward
// dX = dY W and dW = dYᵀ X), X [tokens, in], W [out, in], all bf16, on the current threads;
// best of `reps` after a warm-up, conversions included.
double bf16_gemm_gflops(Bf16Gemm g, int64_t tokens, int64_t in, int64_t out, int reps);

// Whether libtorch's bf16 matmul on this CPU is bf16 compute with fp32 accumulation: its three
// products of one small layer (X [64, 96], W [80, 96], fixed values) within one bf16 rounding
// (rtol 2^-7, atol 1e-3) of the fp32-operand path's. True where oneDNN has a bf16 dot product
// (AVX512_BF16, AMX); false on CPUs whose fallback rounds partial sums to bf16 (AVX2-only:
// off by up to 0.06). fsdp.bf16_gemm = "auto" takes the native path only where this holds.
bool bf16_native_accumulates_in_fp32();

}  // namespace shardtrain::model
