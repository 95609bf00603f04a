// The fused AdamW and SGD kernels against torch::optim::AdamW and torch::optim::SGD, over several
// decay-mask layouts: each mask segment is one torch parameter, in a decay or a no-decay group.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "shardtrain/optim/adamw.h"
#include "shardtrain/optim/sgd.h"

namespace so = shardtrain::optim;

namespace {

struct Segment {
  int64_t begin, end;
  bool decayed;
};

// Written independently of the library's walker: one flag per element, then runs of equal flags.
std::vector<Segment> segments_of(const so::DecayMask& mask, int64_t n) {
  std::vector<bool> decayed(static_cast<size_t>(n), false);
  for (const auto& r : mask.ranges())
    for (int64_t i = r.begin; i < r.end; ++i) decayed[static_cast<size_t>(i)] = true;
  std::vector<Segment> out;
  for (int64_t i = 0; i < n; ++i) {
    if (out.empty() || out.back().decayed != decayed[static_cast<size_t>(i)])
      out.push_back({i, i + 1, decayed[static_cast<size_t>(i)]});
    else
      out.back().end = i + 1;
  }
  return out;
}

struct Layout {
  std::string name;
  int64_t n;
  so::DecayMask mask;
};

// gtest prints parameters of failed tests; the name says which layout it was.
void PrintTo(const Layout& layout, std::ostream* os) { *os << layout.name; }

std::vector<Layout> layouts() {
  std::vector<so::ElementRange> every_other;
  for (int64_t b = 1; b + 3 <= 1031; b += 6) every_other.push_back({b, b + 3});
  return {
      {"empty", 1031, so::DecayMask::none()},
      {"full", 1031, so::DecayMask::all(1031)},
      {"split", 1031, so::DecayMask({{0, 300}, {301, 700}, {950, 1031}})},
      {"interior_and_single", 1031, so::DecayMask({{17, 18}, {100, 513}})},
      {"many_small", 1031, so::DecayMask(every_other)},
      {"large_split", 70001, so::DecayMask({{5, 40000}, {40123, 69000}})},
  };
}

// Both torch 1.13 (std::string keys) and 2.x (void* keys) key optimizer state by TensorImpl*.
template <class StateMap>
torch::optim::OptimizerParamState& torch_state(StateMap& state, const torch::Tensor& p) {
  using Key = typename std::decay_t<StateMap>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << p.unsafeGetTensorImpl();
    auto it = state.find(key.str());
    EXPECT_NE(it, state.end());
    return *it->second;
  } else {
    auto it = state.find(static_cast<Key>(p.unsafeGetTensorImpl()));
    EXPECT_NE(it, state.end());
    return *it->second;
  }
}

std::vector<float> to_vector(const torch::Tensor& t) {
  auto c = t.contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// |got - want| <= rtol * (|want| + max|want|). The scale term is needed because torch's
// vectorised kernels fuse some multiply-adds (FMA) and ours cannot portably, so the two differ by
// about one rounding of the *operands*; where a result is small by cancellation (a moment
// crossing zero: 0.9*0.45 - 0.1*4.0) that rounding is large relative to the result itself.
// Returns the largest |got - want| / max|want| seen, for the log.
double expect_close(const float* got, const torch::Tensor& want, double rtol, const std::string& what) {
  auto w = want.contiguous();
  const float* pw = w.data_ptr<float>();
  double scale = 0.0;
  for (int64_t i = 0; i < w.numel(); ++i) scale = std::max(scale, std::fabs(double(pw[i])));
  double worst = 0.0;
  int failures = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const double diff = std::fabs(double(got[i]) - double(pw[i]));
    if (scale > 0.0) worst = std::max(worst, diff / scale);
    if (diff > rtol * (std::fabs(double(pw[i])) + scale) && failures++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: fused " << got[i] << " torch " << pw[i];
  }
  EXPECT_EQ(failures, 0) << what;
  return worst;
}

// The flat shard and its torch mirror: one torch parameter per mask segment.
struct Mirror {
  std::vector<float> param;
  std::vector<Segment> segments;
  std::vector<torch::Tensor> tensors;  // views of nothing: torch owns copies of the segments
  torch::Tensor flat_grad;

  Mirror(const Layout& layout, uint64_t seed) {
    torch::manual_seed(seed);
    param = to_vector(torch::randn({layout.n}));
    segments = segments_of(layout.mask, layout.n);
    for (const Segment& s : segments)
      tensors.push_back(torch::from_blob(param.data() + s.begin, {s.end - s.begin}).clone());
  }

  // Draws a new gradient and hands each torch parameter its slice.
  const float* new_grad() {
    flat_grad = torch::randn({static_cast<int64_t>(param.size())});
    for (size_t k = 0; k < segments.size(); ++k)
      tensors[k].mutable_grad() =
          flat_grad.slice(0, segments[k].begin, segments[k].end).clone();
    return flat_grad.data_ptr<float>();
  }

  std::vector<torch::optim::OptimizerParamGroup> groups(
      const torch::optim::OptimizerOptions& decay_opts,
      const torch::optim::OptimizerOptions& no_decay_opts) const {
    std::vector<torch::Tensor> decay, no_decay;
    for (size_t k = 0; k < segments.size(); ++k)
      (segments[k].decayed ? decay : no_decay).push_back(tensors[k]);
    std::vector<torch::optim::OptimizerParamGroup> out;
    if (!decay.empty()) out.emplace_back(decay, decay_opts.clone());
    if (!no_decay.empty()) out.emplace_back(no_decay, no_decay_opts.clone());
    return out;
  }
};

float lr_of_step(int64_t step) { return 1e-3f * static_cast<float>(step) / 3.0f + 2e-4f; }

constexpr double kRtol = 1e-6;
constexpr int kSteps = 6;

class OptimTorchReference : public ::testing::TestWithParam<Layout> {};

TEST_P(OptimTorchReference, AdamWMatchesTorchAdamW) {
  const Layout& layout = GetParam();
  for (const so::AdamWConfig cfg : {so::AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f},
                                    so::AdamWConfig{0.8f, 0.999f, 1e-3f, 0.5f}}) {
    Mirror mirror(layout, 1234);
    const int64_t n = layout.n;
    std::vector<float> m(static_cast<size_t>(n), 0.0f), v(static_cast<size_t>(n), 0.0f);

    auto opts = torch::optim::AdamWOptions(1e-3).betas({cfg.beta1, cfg.beta2}).eps(cfg.eps);
    auto decay_opts = opts;
    decay_opts.weight_decay(cfg.weight_decay);
    auto no_decay_opts = opts;
    no_decay_opts.weight_decay(0.0);
    torch::optim::AdamW torch_opt(mirror.groups(decay_opts, no_decay_opts));

    for (int64_t step = 1; step <= kSteps; ++step) {
      const float lr = lr_of_step(step);
      for (auto& group : torch_opt.param_groups())
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
      const float* grad = mirror.new_grad();
      torch_opt.step();
      so::adamw_step(mirror.param.data(), grad, m.data(), v.data(), n, layout.mask, cfg, lr, step);
    }

    std::vector<torch::Tensor> want_m, want_v;
    for (const torch::Tensor& t : mirror.tensors) {
      const auto& st = static_cast<torch::optim::AdamWParamState&>(torch_state(torch_opt.state(), t));
      EXPECT_EQ(st.step(), kSteps);
      want_m.push_back(st.exp_avg());
      want_v.push_back(st.exp_avg_sq());
    }
    const double worst = std::max(
        {expect_close(mirror.param.data(), torch::cat(mirror.tensors), kRtol, "param"),
         expect_close(m.data(), torch::cat(want_m), kRtol, "exp_avg"),
         expect_close(v.data(), torch::cat(want_v), kRtol, "exp_avg_sq")});
    std::cout << layout.name << " adamw(beta2=" << cfg.beta2
              << "): largest |fused - torch| / max|torch| " << worst << "\n";
  }
}

TEST_P(OptimTorchReference, SGDMatchesTorchSGD) {
  const Layout& layout = GetParam();
  for (const so::SGDConfig cfg : {so::SGDConfig{0.9f, 0.01f, false}, so::SGDConfig{0.9f, 0.05f, true},
                                  so::SGDConfig{0.0f, 0.02f, false}}) {
    Mirror mirror(layout, 99);
    const int64_t n = layout.n;
    std::vector<float> buf(static_cast<size_t>(n), 12345.0f);  // the first step must overwrite it

    auto opts = torch::optim::SGDOptions(1e-2).momentum(cfg.momentum).nesterov(cfg.nesterov);
    auto decay_opts = opts;
    decay_opts.weight_decay(cfg.weight_decay);
    auto no_decay_opts = opts;
    no_decay_opts.weight_decay(0.0);
    torch::optim::SGD torch_opt(mirror.groups(decay_opts, no_decay_opts), opts);

    for (int64_t step = 1; step <= kSteps; ++step) {
      const float lr = 10.0f * lr_of_step(step);
      for (auto& group : torch_opt.param_groups())
        static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
      const float* grad = mirror.new_grad();
      torch_opt.step();
      so::sgd_step(mirror.param.data(), grad, cfg.momentum != 0.0f ? buf.data() : nullptr, n,
                   layout.mask, cfg, lr, step);
    }

    double worst = expect_close(mirror.param.data(), torch::cat(mirror.tensors), kRtol, "param");
    if (cfg.momentum != 0.0f) {
      std::vector<torch::Tensor> want_buf;
      for (const torch::Tensor& t : mirror.tensors)
        want_buf.push_back(
            static_cast<torch::optim::SGDParamState&>(torch_state(torch_opt.state(), t)).momentum_buffer());
      worst = std::max(worst, expect_close(buf.data(), torch::cat(want_buf), kRtol, "momentum_buffer"));
    }
    std::cout << layout.name << " sgd(momentum=" << cfg.momentum << ", nesterov=" << cfg.nesterov
              << "): largest |fused - torch| / max|torch| " << worst << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, OptimTorchReference, ::testing::ValuesIn(layouts()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
