// gpu_adamw_cuda: the fused CUDA AdamW kernel against the Kokkos kernel on the host, bit for bit
// (the .cu is compiled with --fmad=false; see adamw_cuda.cu), over several steps, a mask with
// many segments and awkward values. Exits 77 (skipped) without a GPU; with one present (or
// SHARDTRAIN_GPU_REQUIRED=1) a CUDA runtime that finds no device is a failure (gpu_required.h).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gpu_required.h"
#include "shardtrain/optim/adamw.h"
#include "shardtrain/optim/adamw_cuda.h"
#include "shardtrain/optim/kokkos_scope.h"

namespace so = shardtrain::optim;

namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

std::vector<float> random_floats(int64_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) x = dist(gen);
  return out;
}

template <typename T>
struct DeviceArray {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceArray(const std::vector<T>& host) : n(host.size()) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, n) * sizeof(T)) != cudaSuccess) p = nullptr;
    if (p && n) cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceArray() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> out(n);
    if (n) cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }
};

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b, int64_t* first_diff) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      *first_diff = static_cast<int64_t>(i);
      return false;
    }
  return a.size() == b.size();
}

TEST(GpuAdamW, CudaKernelEqualsKokkosBitForBit) {
  so::KokkosScope kokkos;
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{(1 << 22) + 77}}) {
    const so::AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
    std::vector<so::ElementRange> ranges;
    for (int64_t b = 0; b + 300 <= n; b += 517) ranges.push_back({b, b + 300});
    const so::DecayMask mask(ranges);
    const std::vector<int64_t> bounds = so::decay_bounds(mask, cfg);

    std::vector<float> p = random_floats(n, 1, 0.02f), m(n, 0.0f), v(n, 0.0f);
    DeviceArray<float> dp(p), dm(m), dv(v);
    DeviceArray<int64_t> db(bounds);
    ASSERT_TRUE(dp.p && dm.p && dv.p && db.p);
    for (int64_t step = 1; step <= 4; ++step) {
      std::vector<float> g = random_floats(n, 100 + static_cast<uint32_t>(step), step == 3 ? 1e-6f : 1.0f);
      if (n > 5) {
        g[3] = 0.0f;
        g[4] = std::numeric_limits<float>::min();
        g[5] = 1e20f;
      }
      DeviceArray<float> dg(g);
      const float lr = 3e-4f * static_cast<float>(step);
      so::adamw_step(p.data(), g.data(), m.data(), v.data(), n, mask, cfg, lr, step);
      so::adamw_step_cuda(dp.p, dg.p, dm.p, dv.p, n, db.p, static_cast<int64_t>(bounds.size()),
                          so::adamw_scalars(cfg, lr, step), nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      int64_t at = -1;
      ASSERT_TRUE(bit_equal(dp.get(), p, &at)) << "n " << n << " step " << step << " param " << at;
      ASSERT_TRUE(bit_equal(dm.get(), m, &at)) << "n " << n << " step " << step << " exp_avg " << at;
      ASSERT_TRUE(bit_equal(dv.get(), v, &at)) << "n " << n << " step " << step << " exp_avg_sq " << at;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    // With a GPU present (or SHARDTRAIN_GPU_REQUIRED=1) this is a failure, not a skip.
    namespace gt = shardtrain::gputest;
    const gt::CannotRun c{err != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err)
                                             : std::string("no CUDA device")};
    return gt::cannot_run_exit(c, gt::must_fail(c), true);
  }
  return RUN_ALL_TESTS();
}
