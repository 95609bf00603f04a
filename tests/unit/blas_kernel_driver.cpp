// blas_kernel_driver: runs runtime::select_blas_kernel() like main() does (it may switch
// OpenBLAS's core) and prints the result as key=value lines, with a hash of the bits of one fp32
// product through sgemm_ and one through libtorch (at::mm), for test_blas_kernel.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "shardtrain/runtime/blas_kernel.h"

extern "C" char* openblas_get_corename() __attribute__((weak));
using Sgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                      const int*, const float*, const int*, const float*, float*, const int*);

namespace {
uint64_t fnv1a(const float* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
}  // namespace

int main() {
  shardtrain::runtime::select_blas_kernel();
  const auto& k = shardtrain::runtime::blas_kernel();
  std::printf("pid=%d\ndecision=%s\ncore=%s\nautodetected=%s\nlibrary=%s\nreason=%s\n", getpid(), k.decision.c_str(),
              k.core.c_str(), k.autodetected.c_str(), k.library.c_str(), k.reason.c_str());
  std::printf("running=%s\n", openblas_get_corename ? openblas_get_corename() : "");
  std::printf("gflops=%.3f\nfallback_gflops=%.3f\nchecked=%d\naccurate=%d\n", k.gflops, k.fallback_gflops, k.checked,
              k.accurate);
  std::printf("coretype_env=%s\n", std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "");
  // One product of fixed inputs (odd sizes: edge kernels too), through sgemm_ and through libtorch.
  const int m = 131, n = 97, kk = 263;
  std::vector<float> a(size_t(m) * kk), b(size_t(kk) * n), c(size_t(m) * n);
  uint64_t s = 7;
  for (auto* v : {&a, &b})
    for (float& x : *v) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      x = static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / float(1 << 23);
    }
  const float one = 1, zero = 0;
  auto sgemm = reinterpret_cast<Sgemm>(dlsym(RTLD_DEFAULT, "sgemm_"));
  if (sgemm) sgemm("N", "N", &m, &n, &kk, &one, a.data(), &m, b.data(), &kk, &zero, c.data(), &m);
  std::printf("sgemm_bits=%016llx\n", static_cast<unsigned long long>(fnv1a(c.data(), c.size())));
  at::set_num_threads(1);
  const at::Tensor ta = at::from_blob(a.data(), {kk, m}).t(), tb = at::from_blob(b.data(), {n, kk}).t();
  const at::Tensor tc = at::mm(ta, tb).contiguous();
  std::printf("torch_bits=%016llx\n", static_cast<unsigned long long>(fnv1a(tc.data_ptr<float>(), tc.numel())));
  std::printf("line=%s\n", k.line().c_str());
  return 0;
}
