// DecayMask normalisation, LR schedule values, reductions, the state owners and KokkosScope.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "shardtrain/optim/adamw.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/optim/lr_schedule.h"
#include "shardtrain/optim/reductions.h"
#include "shardtrain/optim/sgd.h"
#include "shardtrain/util/error.h"

namespace so = shardtrain::optim;

namespace {

std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) x = dist(gen);
  return out;
}

TEST(DecayMask, DropsEmptyAndMergesTouchingRanges) {
  so::DecayMask mask({{0, 4}, {4, 4}, {4, 9}, {12, 12}, {20, 25}, {25, 30}});
  const std::vector<so::ElementRange> want{{0, 9}, {20, 30}};
  EXPECT_EQ(mask.ranges(), want);
  EXPECT_EQ(mask.decayed_elements(), 19);
  EXPECT_EQ(mask.extent(), 30);
  EXPECT_EQ(so::DecayMask::none().extent(), 0);
  EXPECT_EQ(so::DecayMask::all(7).decayed_elements(), 7);
}

TEST(DecayMask, RejectsUnsortedOrOverlappingRanges) {
  EXPECT_THROW(so::DecayMask({{5, 10}, {0, 3}}), shardtrain::Error);
  EXPECT_THROW(so::DecayMask({{0, 10}, {9, 12}}), shardtrain::Error);
  EXPECT_THROW(so::DecayMask({{-1, 3}}), shardtrain::Error);
  EXPECT_THROW(so::DecayMask({{4, 3}}), shardtrain::Error);
}

TEST(DecayMask, RestrictToShardShiftsAndClips) {
  // A unit of 40 elements: weight [0,16), bias [16,20), weight [20,36), norm [36,40); 4 ranks.
  so::DecayMask unit({{0, 16}, {20, 36}});
  EXPECT_EQ(unit.restrict_to(0, 10).ranges(), (std::vector<so::ElementRange>{{0, 10}}));
  EXPECT_EQ(unit.restrict_to(10, 20).ranges(), (std::vector<so::ElementRange>{{0, 6}}));
  EXPECT_EQ(unit.restrict_to(20, 30).ranges(), (std::vector<so::ElementRange>{{0, 10}}));
  EXPECT_EQ(unit.restrict_to(30, 40).ranges(), (std::vector<so::ElementRange>{{0, 6}}));
  EXPECT_EQ(unit.restrict_to(15, 25).ranges(), (std::vector<so::ElementRange>{{0, 1}, {5, 10}}));
  EXPECT_TRUE(unit.restrict_to(16, 20).ranges().empty());
}

TEST(AdamW, MaskLongerThanShardIsAnError) {
  std::vector<float> p(8, 1.0f), g(8, 1.0f), m(8, 0.0f), v(8, 0.0f);
  EXPECT_THROW(so::adamw_step(p.data(), g.data(), m.data(), v.data(), 8, so::DecayMask::all(9),
                              so::AdamWConfig{}, 1e-3f, 1),
               shardtrain::Error);
  EXPECT_THROW(so::adamw_step(p.data(), g.data(), m.data(), v.data(), 8, so::DecayMask::none(),
                              so::AdamWConfig{}, 1e-3f, 0),
               shardtrain::Error);
}

TEST(AdamW, ConfigValidationRejectsWhatTorchRejects) {
  EXPECT_THROW((so::AdamWConfig{1.0f, 0.999f, 1e-8f, 0.0f}.validate()), shardtrain::UserError);
  EXPECT_THROW((so::AdamWConfig{0.9f, -0.1f, 1e-8f, 0.0f}.validate()), shardtrain::UserError);
  EXPECT_THROW((so::AdamWConfig{0.9f, 0.999f, -1.0f, 0.0f}.validate()), shardtrain::UserError);
  EXPECT_THROW((so::AdamWConfig{0.9f, 0.999f, 1e-8f, -0.1f}.validate()), shardtrain::UserError);
  EXPECT_NO_THROW(so::AdamWConfig{}.validate());
  EXPECT_THROW((so::SGDConfig{0.0f, 0.0f, true}.validate()), shardtrain::UserError);
}

TEST(AdamW, OwnerMatchesStatelessKernelAndCountsSteps) {
  const int64_t n = 777;
  const so::AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
  const so::DecayMask mask({{10, 500}});
  std::vector<float> p1 = random_floats(n, 1), p2 = p1;
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  so::FusedAdamW owner(n, cfg);
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> g = random_floats(n, 100 + static_cast<uint32_t>(step));
    owner.step(p1.data(), g.data(), n, mask, 1e-3f);
    so::adamw_step(p2.data(), g.data(), m.data(), v.data(), n, mask, cfg, 1e-3f, step);
  }
  EXPECT_EQ(owner.steps_taken(), 3);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(std::vector<float>(owner.exp_avg(), owner.exp_avg() + n), m);
  EXPECT_EQ(std::vector<float>(owner.exp_avg_sq(), owner.exp_avg_sq() + n), v);
  EXPECT_THROW(owner.step(p1.data(), p1.data(), n - 1, mask, 1e-3f), shardtrain::Error);
}

TEST(AdamW, FirstStepMovesEachElementByLrTimesSignOfGrad) {
  // With zero moments, step 1 gives m/(1-b1) = g and sqrt(v/(1-b2)) = |g|: the update is
  // lr*g/(|g|+eps) ~ lr*sign(g), plus lr*wd*p decay on the masked elements only.
  const int64_t n = 64;
  std::vector<float> p(n, 2.0f), m(n, 0.0f), v(n, 0.0f), g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = (i % 2 ? 1.0f : -1.0f) * (0.5f + static_cast<float>(i));
  const float lr = 0.01f, wd = 0.5f;
  so::adamw_step(p.data(), g.data(), m.data(), v.data(), n, so::DecayMask({{0, 32}}),
                 so::AdamWConfig{0.9f, 0.999f, 1e-8f, wd}, lr, 1);
  for (int64_t i = 0; i < n; ++i) {
    const float decayed = i < 32 ? 2.0f * (1.0f - lr * wd) : 2.0f;
    const float want = decayed - lr * (g[i] > 0 ? 1.0f : -1.0f);
    EXPECT_NEAR(p[i], want, 1e-6f) << i;
  }
}

TEST(SGD, OwnerWithoutMomentumKeepsNoBuffer) {
  so::FusedSGD plain(100, so::SGDConfig{0.0f, 0.0f, false});
  EXPECT_EQ(plain.momentum_buffer(), nullptr);
  std::vector<float> p(100, 1.0f), g(100, 0.5f);
  plain.step(p.data(), g.data(), 100, so::DecayMask::none(), 0.1f);
  for (float x : p) EXPECT_FLOAT_EQ(x, 0.95f);
  so::FusedSGD heavy(100, so::SGDConfig{0.9f, 0.0f, false});
  ASSERT_NE(heavy.momentum_buffer(), nullptr);
  heavy.step(p.data(), g.data(), 100, so::DecayMask::none(), 0.1f);
  heavy.step(p.data(), g.data(), 100, so::DecayMask::none(), 0.1f);
  EXPECT_FLOAT_EQ(heavy.momentum_buffer()[7], 0.5f * 0.9f + 0.5f);
  EXPECT_EQ(heavy.steps_taken(), 2);
}

TEST(LrSchedule, CosineMatchesNanoGptAtKeySteps) {
  so::LrSchedule s{so::LrDecay::Cosine, 6e-4f, 6e-5f, 10, 110};
  s.validate();
  EXPECT_FLOAT_EQ(s.lr_at(0), 6e-5f);  // lr * 1/10
  EXPECT_FLOAT_EQ(s.lr_at(4), 3e-4f);  // lr * 5/10
  EXPECT_FLOAT_EQ(s.lr_at(9), 6e-4f);  // warm-up ends at full lr
  EXPECT_FLOAT_EQ(s.lr_at(10), 6e-4f);  // cosine starts at lr
  EXPECT_FLOAT_EQ(s.lr_at(60), 3.3e-4f);  // halfway: (lr + min_lr) / 2
  EXPECT_FLOAT_EQ(s.lr_at(35), static_cast<float>(6e-5 + 0.5 * (1 + std::cos(M_PI * 0.25)) * 5.4e-4));
  EXPECT_FLOAT_EQ(s.lr_at(110), 6e-5f);
  EXPECT_FLOAT_EQ(s.lr_at(100000), 6e-5f);
  for (int64_t step = 11; step < 110; ++step) EXPECT_LT(s.lr_at(step), s.lr_at(step - 1)) << step;
}

TEST(LrSchedule, LinearAndConstant) {
  so::LrSchedule lin{so::LrDecay::Linear, 1.0f, 0.0f, 0, 100};
  EXPECT_FLOAT_EQ(lin.lr_at(0), 1.0f);
  EXPECT_FLOAT_EQ(lin.lr_at(25), 0.75f);
  EXPECT_FLOAT_EQ(lin.lr_at(99), 0.01f);
  EXPECT_FLOAT_EQ(lin.lr_at(100), 0.0f);
  so::LrSchedule flat{so::LrDecay::Constant, 2e-3f, 0.0f, 4, 0};
  flat.validate();
  EXPECT_FLOAT_EQ(flat.lr_at(0), 5e-4f);
  EXPECT_FLOAT_EQ(flat.lr_at(3), 2e-3f);
  EXPECT_FLOAT_EQ(flat.lr_at(1000000), 2e-3f);
}

TEST(LrSchedule, ValidationAndParsing) {
  EXPECT_THROW((so::LrSchedule{so::LrDecay::Cosine, 1e-3f, 2e-3f, 0, 10}.validate()), shardtrain::UserError);
  EXPECT_THROW((so::LrSchedule{so::LrDecay::Cosine, 1e-3f, 0.0f, 10, 10}.validate()), shardtrain::UserError);
  EXPECT_THROW((so::LrSchedule{so::LrDecay::Linear, -1.0f, 0.0f, 0, 10}.validate()), shardtrain::UserError);
  EXPECT_EQ(so::parse_lr_decay("cosine"), so::LrDecay::Cosine);
  EXPECT_EQ(so::parse_lr_decay("linear"), so::LrDecay::Linear);
  EXPECT_EQ(so::parse_lr_decay("constant"), so::LrDecay::Constant);
  EXPECT_STREQ(so::to_string(so::LrDecay::Linear), "linear");
  EXPECT_THROW(so::parse_lr_decay("cosin"), shardtrain::UserError);
}

TEST(Reductions, SumOfSquaresMatchesDoubleReference) {
  for (int64_t n : {0, 1, 7, 8, 4095, 4096, 4097, 1000003}) {
    const std::vector<float> x = random_floats(n, static_cast<uint32_t>(n) + 3, -3.0f, 3.0f);
    double want = 0.0;
    for (float v : x) want += double(v) * double(v);
    const double got = so::sum_of_squares(x.data(), n);
    if (n == 0) EXPECT_EQ(got, 0.0);
    else EXPECT_NEAR(got, want, 1e-12 * want) << n;
  }
  // Values whose float squares would round away: double accumulation keeps them.
  std::vector<float> tiny(1 << 20, 1.0f);
  tiny[0] = 1e4f;
  EXPECT_EQ(so::sum_of_squares(tiny.data(), static_cast<int64_t>(tiny.size())),
            1e8 + double((1 << 20) - 1));
}

TEST(Reductions, ScaleMultipliesEveryElement) {
  std::vector<float> x = random_floats(10001, 5), want = x;
  for (float& v : want) v *= 0.25f;
  so::scale(x.data(), static_cast<int64_t>(x.size()), 0.25f);
  EXPECT_EQ(x, want);
}

TEST(KokkosScope, NestedScopeDoesNotOwnOrFinalize) {
  ASSERT_TRUE(so::kokkos_running());  // the test environment's scope owns the runtime
  {
    so::KokkosScope inner;
    EXPECT_FALSE(inner.owns_runtime());
  }
  EXPECT_TRUE(so::kokkos_running());
  std::vector<float> x(4, 2.0f);
  EXPECT_EQ(so::sum_of_squares(x.data(), 4), 16.0);
}

}  // namespace
