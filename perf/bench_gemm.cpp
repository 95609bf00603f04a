// bench_gemm: GEMM GFLOP/s at the perf/ddp GPT-2 model's linear-layer shapes (forward and both
// backward products) for every kernel choice the CPU path has, next to the theoretical peak,
// with the ratios, measured in one run: OpenBLAS's autodetected core (a child process with the
// selection off), the selected core (this process, runtime::select_blas_kernel), oneDNN's
// dnnl_sgemm, libtorch's bf16 matmul, oneDNN's dnnl_gemm_bf16bf16f32 (AMX where present), and
// an fp32 GEMM on bf16-rounded operands (conversion and the bf16 rounding of the result counted).
//
//   build/bin/bench_gemm [--threads N] [--d 384] [--tokens 512] [--lm-head] [--min-seconds 0.2]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "shardtrain/model/bf16_gemm.h"
#include "shardtrain/runtime/blas_kernel.h"
#include "shardtrain/util/cpu_isa.h"

using namespace shardtrain;

namespace {
// oneDNN's C GEMM API (libdnnl.so.2 is loaded with libtorch; resolved at run time, no header).
using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
using DnnlBf16 = int (*)(char, char, int64_t, int64_t, int64_t, float, const void*, int64_t, const void*, int64_t,
                         float, float*, int64_t);

struct Shape {
  std::string name;
  int64_t m, n, k;  // C[m x n] = A[m x k] B[k x n]
};

double min_seconds = 0.2;

// GFLOP/s of f (one m x n x k product): one warm-up, then best of as many runs as fit in min_seconds (>= 3).
double gflops(const Shape& s, const std::function<void()>& f) {
  f();
  double best = 0, spent = 0;
  for (int r = 0; r < 3 || spent < min_seconds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spent += t;
    best = std::max(best, 2.0 * s.m * s.n * s.k / t / 1e9);
  }
  return best;
}

std::vector<Shape> shapes(int64_t d, int64_t tokens, bool lm_head, int64_t vocab) {
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> layers = {
      {"qkv", {d, 3 * d}}, {"attn.proj", {d, d}}, {"mlp.fc", {d, 4 * d}}, {"mlp.proj", {4 * d, d}}};
  if (lm_head) layers.push_back({"lm_head", {d, vocab}});
  std::vector<Shape> out;
  for (auto& [name, io] : layers) {
    const auto [in, o] = io;
    out.push_back({name + " fwd", tokens, o, in});    // Y = X W^T
    out.push_back({name + " dX", tokens, in, o});     // dX = dY W
    out.push_back({name + " dW", o, in, tokens});     // dW = dY^T X
  }
  return out;
}

// The child: fp32 through libtorch on whatever core OpenBLAS autodetects; "name gflops" lines.
int child(const std::vector<Shape>& ss) {
  for (const Shape& s : ss) {
    at::Tensor a = at::randn({s.m, s.k}), b = at::randn({s.k, s.n});
    std::printf("%s\t%.3f\n", s.name.c_str(), gflops(s, [&] { at::mm(a, b); }));
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  runtime::select_blas_kernel();
  int threads = 1;
  int64_t d = 384, tokens = 512, vocab = 50257;
  bool lm_head = false, is_child = false;
  for (int i = 1; i < argc; ++i) {
    auto val = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_gemm: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(val());
    else if (!std::strcmp(argv[i], "--d")) d = std::atoll(val());
    else if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoll(val());
    else if (!std::strcmp(argv[i], "--min-seconds")) min_seconds = std::atof(val());
    else if (!std::strcmp(argv[i], "--lm-head")) lm_head = true;
    else if (!std::strcmp(argv[i], "--child")) is_child = true;
    else {
      std::fprintf(stderr, "bench_gemm: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (threads < 1 || d < 1 || tokens < 1) {
    std::fprintf(stderr, "bench_gemm: --threads, --d and --tokens must be positive\n");
    return 2;
  }
  at::set_num_threads(threads);
  const std::vector<Shape> ss = shapes(d, tokens, lm_head, vocab);
  if (is_child) return child(ss);

  const runtime::BlasKernel& k = runtime::blas_kernel();
  const CpuIsa& isa = cpu_isa();
  // The autodetected column: the same binary with the selection off and no OPENBLAS_CORETYPE.
  std::map<std::string, double> autodet;
  std::string auto_core = k.autodetected.empty() ? k.core : k.autodetected;
  {
    std::string cmd = "env -u OPENBLAS_CORETYPE SHARDTRAIN_BLAS_SELECT=off /proc/" +
                      std::to_string(getpid()) + "/exe --child --threads " + std::to_string(threads) + " --d " +
                      std::to_string(d) + " --tokens " + std::to_string(tokens) + " --min-seconds " +
                      std::to_string(min_seconds) + (lm_head ? " --lm-head" : "");
    FILE* p = popen(cmd.c_str(), "r");
    char line[256];
    while (p && std::fgets(line, sizeof line, p)) {
      char* tab = std::strchr(line, '\t');
      if (tab) autodet[std::string(line, tab)] = std::atof(tab + 1);
    }
    if (!p || pclose(p) != 0) std::fprintf(stderr, "bench_gemm: the autodetected-core child failed\n");
  }
  auto sgemm = reinterpret_cast<DnnlSgemm>(dlsym(RTLD_DEFAULT, "dnnl_sgemm"));
  auto bgemm = reinterpret_cast<DnnlBf16>(dlsym(RTLD_DEFAULT, "dnnl_gemm_bf16bf16f32"));

  const double peak32 = theoretical_peak_tflops(isa, "fp32", threads) * 1e3;
  const double peak16 = theoretical_peak_tflops(isa, "bf16", threads) * 1e3;
  std::printf("# %s (family %d model %d, %s, %.2f GHz reported), %d thread(s)\n", isa.model_name.c_str(), isa.family,
              isa.model, isa.isa_name().c_str(), isa.clock_ghz, threads);
  std::printf("%s\n", k.line().c_str());
  std::printf("# theoretical peak: fp32 %.0f GFLOP/s, bf16 %.0f GFLOP/s (%d core(s) x clock x FLOPs/cycle)\n", peak32,
              peak16, threads);
  std::printf("# GPT-2 d=%lld, %lld tokens per micro-batch; GFLOP/s, best of >= 3 runs\n\n", (long long)d,
              (long long)tokens);
  std::printf("| product (m x n x k) | OpenBLAS %s | OpenBLAS %s | oneDNN fp32 | torch bf16 | oneDNN bf16 | fp32 on bf16 "
              "operands | selected / autodetected | selected / best fp32 | best bf16 / best fp32 |\n",
              auto_core.c_str(), k.core.c_str());
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  double sum[7] = {};
  for (const Shape& s : ss) {
    at::Tensor a = at::randn({s.m, s.k}), b = at::randn({s.k, s.n}), c = at::empty({s.m, s.n});
    at::Tensor a16 = a.to(at::kBFloat16), b16 = b.to(at::kBFloat16);
    const double g_auto = autodet.count(s.name) ? autodet[s.name] : 0;
    const double g_sel = gflops(s, [&] { at::mm_out(c, a, b); });
    // Row-major C = A B: oneDNN's API is row-major.
    const double g_dnnl = sgemm ? gflops(s, [&] {
      sgemm('N', 'N', s.m, s.n, s.k, 1.f, a.data_ptr<float>(), s.k, b.data_ptr<float>(), s.n, 0.f, c.data_ptr<float>(), s.n);
    }) : 0;
    const double g_t16 = gflops(s, [&] { at::mm(a16, b16); });
    const double g_d16 = bgemm ? gflops(s, [&] {
      bgemm('N', 'N', s.m, s.n, s.k, 1.f, a16.data_ptr(), s.k, b16.data_ptr(), s.n, 0.f, c.data_ptr<float>(), s.n);
    }) : 0;
    const double g_f16 = gflops(s, [&] { at::mm(a16.to(at::kFloat), b16.to(at::kFloat)).to(at::kBFloat16); });
    const double best32 = std::max({g_sel, g_dnnl, g_auto}), best16 = std::max({g_t16, g_d16, g_f16});
    const double row[7] = {g_auto, g_sel, g_dnnl, g_t16, g_d16, g_f16, 0};
    for (int i = 0; i < 6; ++i) sum[i] += 2.0 * s.m * s.n * s.k / std::max(row[i], 1e-9);
    std::printf("| %s (%lld x %lld x %lld) | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f |\n",
                s.name.c_str(), (long long)s.m, (long long)s.n, (long long)s.k, g_auto, g_sel, g_dnnl, g_t16, g_d16,
                g_f16, g_auto > 0 ? g_sel / g_auto : 0, g_sel / best32, best16 / best32);
    std::fflush(stdout);
  }
  // All products of one layer stack at each kernel: total FLOPs / total time.
  double flops = 0;
  for (const Shape& s : ss) flops += 2.0 * s.m * s.n * s.k;
  double g[6];
  for (int i = 0; i < 6; ++i) g[i] = flops / sum[i];
  const double best32 = std::max({g[0], g[1], g[2]}), best16 = std::max({g[3], g[4], g[5]});
  std::printf("| **all products** | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f |\n", g[0], g[1], g[2],
              g[3], g[4], g[5], g[0] > 0 ? g[1] / g[0] : 0, g[1] / best32, best16 / best32);
  std::printf("| theoretical peak | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | | %.2f of peak | |\n", peak32, peak32,
              peak32, peak16, peak16, peak16, g[1] / peak32);
  // The trainer's start-up choice (fsdp.bf16_gemm = auto): its two paths through the model's
  // linear layer, forward + dX + dW with autograd, at the reference layer (train/bf16_choice.cpp).
  const double nat = model::bf16_gemm_gflops(model::Bf16Gemm::Native, 512, 384, 1536, 5);
  const double f32 = model::bf16_gemm_gflops(model::Bf16Gemm::Fp32Operands, 512, 384, 1536, 5);
  std::printf("\n# fsdp.bf16_gemm candidates (model::linear, 512 tokens, 384 -> 1536, forward + dX + dW): "
              "libtorch bf16 %.1f GFLOP/s, fp32 on bf16 operands %.1f GFLOP/s -> auto picks %s\n",
              nat, f32, f32 >= 1.2 * nat ? "fp32" : "bf16");
  return 0;
}
