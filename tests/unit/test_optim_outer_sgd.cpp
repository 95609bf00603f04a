// DiLoCo's outer SGD kernel (optim/outer_sgd.h) against a hand computation: exact small cases
// worked out on paper (values exact in binary), and random shards against the formula evaluated
// one fp32 operation at a time, both bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "shardtrain/optim/outer_sgd.h"

namespace so = shardtrain::optim;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(OuterSGD, NesterovTwoStepsByHand) {
  // outer_lr 0.5, momentum 0.5, Nesterov. Step 1: g = outer - local = [0.5, -1]; m = g;
  // u = g + 0.5 m = [0.75, -1.5]; outer = [1, -2] - 0.5 u = [0.625, -1.25].
  std::vector<float> outer{1.0f, -2.0f}, m{0.0f, 0.0f}, local{0.5f, -1.0f};
  std::vector<float> g{outer[0] - local[0], outer[1] - local[1]};
  const so::OuterSGDConfig cfg{0.5f, 0.5f, true};
  so::outer_sgd_step(outer.data(), m.data(), g.data(), local.data(), 2, cfg);
  EXPECT_TRUE(same_bits(outer, {0.625f, -1.25f}));
  EXPECT_TRUE(same_bits(local, outer)) << "the replica restarts from the outer copy";
  EXPECT_TRUE(same_bits(m, {0.5f, -1.0f}));
  // Step 2: the replica moved to [0.375, -1]: g = [0.25, -0.25]; m = 0.5 [0.5, -1] + g =
  // [0.5, -0.75]; u = g + 0.5 m = [0.5, -0.625]; outer = [0.625, -1.25] - 0.5 u = [0.375, -0.9375].
  local = {0.375f, -1.0f};
  g = {outer[0] - local[0], outer[1] - local[1]};
  so::outer_sgd_step(outer.data(), m.data(), g.data(), local.data(), 2, cfg);
  EXPECT_TRUE(same_bits(m, {0.5f, -0.75f}));
  EXPECT_TRUE(same_bits(outer, {0.375f, -0.9375f}));
  EXPECT_TRUE(same_bits(local, {0.375f, -0.9375f}));
}

TEST(OuterSGD, HeavyBallAndNoLocalByHand) {
  // Heavy ball: u = m = g = [0.5, -1]; outer = [1, -2] - 0.5 u = [0.75, -1.5]; no local copy given.
  std::vector<float> outer{1.0f, -2.0f}, m{0.0f, 0.0f}, g{0.5f, -1.0f};
  so::outer_sgd_step(outer.data(), m.data(), g.data(), nullptr, 2, so::OuterSGDConfig{0.5f, 0.5f, false});
  EXPECT_TRUE(same_bits(outer, {0.75f, -1.5f}));
  // lr 1, no momentum: the outer copy becomes outer - g, i.e. the local weights (exactly here).
  outer = {1.0f, -2.0f};
  m = {0.0f, 0.0f};
  std::vector<float> local{0.0f, 0.0f};
  so::outer_sgd_step(outer.data(), m.data(), g.data(), local.data(), 2, so::OuterSGDConfig{1.0f, 0.0f, false});
  EXPECT_TRUE(same_bits(outer, {0.5f, -1.0f}));
  EXPECT_TRUE(same_bits(local, {0.5f, -1.0f}));
}

TEST(OuterSGD, RandomShardsEqualTheFormulaOneRoundingAtATime) {
  const int64_t n = 1000;
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (const bool nesterov : {true, false}) {
    std::vector<float> outer(n), m(n), local(n), want_outer(n), want_m(n);
    for (int64_t i = 0; i < n; ++i) outer[i] = d(gen), m[i] = d(gen) * 0.1f;
    want_outer = outer;
    want_m = m;
    const so::OuterSGDConfig cfg{0.7f, 0.9f, nesterov};
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g(n);
      for (int64_t i = 0; i < n; ++i) g[i] = d(gen) * 0.01f;
      so::outer_sgd_step(outer.data(), m.data(), g.data(), local.data(), n, cfg);
      for (int64_t i = 0; i < n; ++i) {
        volatile float mm = cfg.momentum * want_m[i];  // volatile: one rounding per operation
        mm = mm + g[i];
        want_m[i] = mm;
        volatile float u = mm;
        if (nesterov) {
          volatile float t = cfg.momentum * mm;
          u = g[i] + t;
        }
        volatile float step_ = -cfg.lr * u;
        want_outer[i] = want_outer[i] + step_;
      }
      ASSERT_TRUE(same_bits(m, want_m)) << "step " << step << " nesterov " << nesterov;
      ASSERT_TRUE(same_bits(outer, want_outer)) << "step " << step << " nesterov " << nesterov;
      ASSERT_TRUE(same_bits(local, outer));
    }
  }
}

}  // namespace
