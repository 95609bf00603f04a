// The device AdamW's host-side logic: the CUDA kernel's loop (adamw_step_host_loop: the same
// adamw_update and per-element bounds lookup the .cu runs) against the Kokkos kernel, bit for
// bit, over masks with many segments, several steps and awkward values. The device itself is
// checked against this loop by the `gpu` test gpu_adamw_cuda.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "shardtrain/optim/adamw.h"
#include "shardtrain/optim/adamw_cuda.h"

namespace so = shardtrain::optim;

namespace {

std::vector<float> random_floats(int64_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) x = dist(gen);
  return out;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(DeviceAdamWMath, BoundsLookupMatchesTheMaskSegments) {
  const so::DecayMask mask({{0, 3}, {5, 6}, {10, 20}});
  const std::vector<int64_t> b = so::decay_bounds(mask, so::AdamWConfig{});
  ASSERT_EQ(b, (std::vector<int64_t>{0, 3, 5, 6, 10, 20}));
  for (int64_t i = 0; i < 25; ++i) {
    bool want = (i < 3) || i == 5 || (i >= 10 && i < 20);
    EXPECT_EQ(so::in_decayed_range(b.data(), static_cast<int64_t>(b.size()), i), want) << i;
  }
  EXPECT_FALSE(so::in_decayed_range(nullptr, 0, 0));
  // No weight decay: nothing decays, whatever the mask.
  EXPECT_TRUE(so::decay_bounds(mask, so::AdamWConfig{0.9f, 0.999f, 1e-8f, 0.0f}).empty());
}

// The loop the CUDA kernel runs equals the Kokkos kernel to the last bit: both call adamw_update
// with the same scalars; the Kokkos one walks segments, this one looks each element up.
TEST(DeviceAdamWMath, HostLoopOfTheCudaKernelEqualsKokkosBitForBit) {
  const int64_t n = 10007;
  const so::AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
  // Many segments (a GPT-2 unit shard: weights decay, biases and norms do not), edges included.
  std::vector<so::ElementRange> ranges;
  for (int64_t b = 0; b + 300 <= n; b += 517) ranges.push_back({b, b + 300});
  ranges.push_back({n - 7, n});
  const so::DecayMask mask(ranges);
  const std::vector<int64_t> bounds = so::decay_bounds(mask, cfg);

  std::vector<float> p1 = random_floats(n, 1, 0.02f), m1(n, 0.0f), v1(n, 0.0f);
  p1[0] = 0.0f;
  p1[1] = -0.0f;
  p1[2] = std::numeric_limits<float>::denorm_min();
  std::vector<float> p2 = p1, m2 = m1, v2 = v1;
  for (int64_t step = 1; step <= 5; ++step) {
    std::vector<float> g = random_floats(n, 100 + static_cast<uint32_t>(step), step == 3 ? 1e-6f : 1.0f);
    g[3] = 0.0f;                                  // no gradient: only decay and momentum move it
    g[4] = std::numeric_limits<float>::min();     // smallest normal: v underflows
    g[5] = 1e20f;                                 // huge: (1-b2)*g*g overflows to inf in fp32
    const float lr = 3e-4f * static_cast<float>(step);
    so::adamw_step(p1.data(), g.data(), m1.data(), v1.data(), n, mask, cfg, lr, step);
    so::adamw_step_host_loop(p2.data(), g.data(), m2.data(), v2.data(), n, bounds.data(),
                             static_cast<int64_t>(bounds.size()), so::adamw_scalars(cfg, lr, step));
    ASSERT_TRUE(bit_equal(p1, p2)) << "param after step " << step;
    ASSERT_TRUE(bit_equal(m1, m2)) << "exp_avg after step " << step;
    ASSERT_TRUE(bit_equal(v1, v2)) << "exp_avg_sq after step " << step;
  }
}

TEST(DeviceAdamWMath, KernelAvailabilityMatchesTheBuild) {
#ifdef SHARDTRAIN_HAVE_CUDA_KERNELS
  EXPECT_TRUE(so::adamw_cuda_built());
#else
  EXPECT_FALSE(so::adamw_cuda_built());
  float x = 0;
  EXPECT_THROW(so::adamw_step_cuda(&x, &x, &x, &x, 1, nullptr, 0, so::AdamWScalars{}, nullptr), std::exception);
#endif
}

}  // namespace
