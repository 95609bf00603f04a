// bench_optim: fused AdamW/SGD bandwidth next to memcpy and torch::optim, in one run, one thread.
//
// Bytes moved per element (the convention of the GB/s column): AdamW reads param, grad, exp_avg,
// exp_avg_sq and writes param, exp_avg, exp_avg_sq: 7 x 4 = 28 B. SGD with momentum reads param,
// grad, buf and writes param, buf: 20 B. memcpy of B bytes counts 2B (read + write), and copies
// as many bytes as the kernel it sits next to, so "of memcpy" compares equal traffic.
// Each time is the best of several repetitions after one warm-up (first touch of the pages).
#include <torch/torch.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "shardtrain/optim/adamw.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/optim/reductions.h"
#include "shardtrain/optim/sgd.h"
#include "shardtrain/util/timer.h"

namespace so = shardtrain::optim;

namespace {

double best_seconds(int reps, const std::function<void()>& fn) {
  fn();  // warm-up: page faults and caches
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    shardtrain::Timer t;
    fn();
    best = std::min(best, t.seconds());
  }
  return best;
}

// The alternative to walking DecayMask ranges: a precomputed per-element 0/1 float array that
// the kernel multiplies in. One extra array read (32 B/elem instead of 28); no segment walk.
struct AdamWFloatMaskKernel {
  float* p;
  const float* g;
  float* m;
  float* v;
  const float* mask;
  float lr_wd, b1, omb1, b2, omb2, eps_scaled, neg_step;  // as in src/optim/adamw.cpp
  KOKKOS_INLINE_FUNCTION void operator()(const long i) const {
    const float gi = g[i];
    const float pi = p[i] * (1.0f - lr_wd * mask[i]);
    const float mi = m[i] * b1 + omb1 * gi;
    const float vi = v[i] * b2 + omb2 * gi * gi;
    const float denom = std::sqrt(vi) + eps_scaled;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + neg_step * mi / denom;
  }
};

// Transformer-like mask: in every period, the first `decayed` elements are a weight matrix
// (decayed) and the rest are biases/norms (not decayed).
so::DecayMask periodic_mask(int64_t n, int64_t period, int64_t decayed) {
  std::vector<so::ElementRange> ranges;
  for (int64_t b = 0; b < n; b += period) ranges.push_back({b, std::min(b + decayed, n)});
  return so::DecayMask(std::move(ranges));
}

struct Row {
  std::string kernel;
  double seconds, bytes;
  double memcpy_seconds;  // same bytes through memcpy; 0 when not compared
  double torch_seconds;   // torch::optim on the same elements; 0 when not compared
};

void print_rows(int64_t n, const std::vector<Row>& rows) {
  for (const Row& r : rows) {
    std::printf("| %4lldM | %-34s | %8.2f | %6.2f |", static_cast<long long>(n >> 20), r.kernel.c_str(),
                r.seconds * 1e3, r.bytes / r.seconds / 1e9);
    if (r.memcpy_seconds > 0) std::printf(" %6.2f | %5.2f |", r.bytes / r.memcpy_seconds / 1e9, r.memcpy_seconds / r.seconds);
    else std::printf("        |       |");
    if (r.torch_seconds > 0) std::printf(" %8.2f | %5.2fx |\n", r.torch_seconds * 1e3, r.torch_seconds / r.seconds);
    else std::printf("          |        |\n");
  }
  std::fflush(stdout);
}

double memcpy_seconds(int64_t bytes_moved, int reps) {
  const size_t half = static_cast<size_t>(bytes_moved / 2);
  std::vector<char> src(half, 1), dst(half, 0);
  return best_seconds(reps, [&] { std::memcpy(dst.data(), src.data(), half); });
}

void bench_size(int64_t n, int reps) {
  std::vector<Row> rows;
  torch::manual_seed(0);
  auto p_t = torch::randn({n});
  auto g_t = torch::randn({n});
  std::vector<float> p(p_t.data_ptr<float>(), p_t.data_ptr<float>() + n);
  std::vector<float> g(g_t.data_ptr<float>(), g_t.data_ptr<float>() + n);
  std::vector<float> m(static_cast<size_t>(n), 0.0f), v(static_cast<size_t>(n), 0.0f);
  const so::AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
  const float lr = 1e-4f;  // small, so repeated steps keep the values in a normal range
  int64_t step = 0;

  // AdamW, torch: one parameter of n elements, decay on all of it.
  double torch_adamw;
  {
    auto param = p_t.clone();
    param.mutable_grad() = g_t.clone();
    torch::optim::AdamW opt({param}, torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).weight_decay(0.1));
    torch_adamw = best_seconds(reps, [&] { opt.step(); });
  }
  const double adamw_bytes = 28.0 * double(n);
  const double memcpy_adamw = memcpy_seconds(static_cast<int64_t>(adamw_bytes), reps);

  const so::DecayMask full = so::DecayMask::all(n);
  rows.push_back({"adamw fused, 1 range", best_seconds(reps, [&] {
                    so::adamw_step(p.data(), g.data(), m.data(), v.data(), n, full, cfg, lr, ++step);
                  }), adamw_bytes, memcpy_adamw, torch_adamw});
  const so::DecayMask coarse = periodic_mask(n, 1 << 16, (1 << 16) - 1024);
  rows.push_back({"adamw fused, ranges of 64K", best_seconds(reps, [&] {
                    so::adamw_step(p.data(), g.data(), m.data(), v.data(), n, coarse, cfg, lr, ++step);
                  }), adamw_bytes, memcpy_adamw, torch_adamw});
  const so::DecayMask medium = periodic_mask(n, 1024, 768);
  rows.push_back({"adamw fused, ranges of 1K", best_seconds(reps, [&] {
                    so::adamw_step(p.data(), g.data(), m.data(), v.data(), n, medium, cfg, lr, ++step);
                  }), adamw_bytes, memcpy_adamw, torch_adamw});
  const so::DecayMask fine = periodic_mask(n, 64, 48);
  rows.push_back({"adamw fused, ranges of 64", best_seconds(reps, [&] {
                    so::adamw_step(p.data(), g.data(), m.data(), v.data(), n, fine, cfg, lr, ++step);
                  }), adamw_bytes, memcpy_adamw, torch_adamw});
  {
    std::vector<float> mask(static_cast<size_t>(n), 0.0f);
    for (const auto& r : fine.ranges()) std::fill(mask.begin() + r.begin, mask.begin() + r.end, 1.0f);
    rows.push_back({"adamw float-mask array (any mask)", best_seconds(reps, [&] {
                      ++step;
                      const double bc1 = 1.0 - std::pow(0.9, double(step)), bc2 = 1.0 - std::pow(0.95, double(step));
                      AdamWFloatMaskKernel k{p.data(), g.data(), m.data(), v.data(), mask.data(),
                                             lr * cfg.weight_decay, 0.9f, 0.1f, 0.95f, 0.05f,
                                             float(1e-8 * std::sqrt(bc2)), float(-lr * std::sqrt(bc2) / bc1)};
                      Kokkos::parallel_for("adamw_float_mask",
                          Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<long>>(0, n), k);
                    }), adamw_bytes, memcpy_adamw, torch_adamw});
  }

  // SGD with momentum 0.9 and weight decay.
  double torch_sgd;
  {
    auto param = p_t.clone();
    param.mutable_grad() = g_t.clone();
    torch::optim::SGD opt({param}, torch::optim::SGDOptions(lr).momentum(0.9).weight_decay(0.01));
    torch_sgd = best_seconds(reps, [&] { opt.step(); });
  }
  const double sgd_bytes = 20.0 * double(n);
  const so::SGDConfig sgd_cfg{0.9f, 0.01f, false};
  int64_t sgd_step = 0;
  rows.push_back({"sgd momentum fused, 1 range", best_seconds(reps, [&] {
                    so::sgd_step(p.data(), g.data(), m.data(), n, full, sgd_cfg, lr, ++sgd_step);
                  }), sgd_bytes, memcpy_seconds(static_cast<int64_t>(sgd_bytes), reps), torch_sgd});

  // Gradient clipping's norm: reads 4 B/elem; compared with torch's (g*g).sum() in double.
  double sink = 0.0;
  const double torch_norm = best_seconds(reps, [&] { sink += g_t.to(torch::kDouble).square().sum().item<double>(); });
  rows.push_back({"sum_of_squares (double)", best_seconds(reps, [&] { sink += so::sum_of_squares(g.data(), n); }),
                  4.0 * double(n), 0.0, torch_norm});
  if (sink == 42.0) std::printf("#\n");  // keeps the reductions from being optimised away
  print_rows(n, rows);
}

}  // namespace

int main(int argc, char** argv) {
  so::KokkosScope kokkos;   // the process's one Kokkos runtime
  torch::set_num_threads(1);  // compare single-threaded kernels (Kokkos Serial is one thread)
  std::vector<int64_t> sizes_m{1, 16, 64};
  if (argc > 1) {
    sizes_m.clear();
    for (int i = 1; i < argc; ++i) sizes_m.push_back(std::atoll(argv[i]));
  }
  std::printf("bench_optim: single thread (Kokkos %s, torch threads %d); best of several runs\n",
              Kokkos::DefaultExecutionSpace::name(), torch::get_num_threads());
  std::printf("GB/s counts 28 B/elem for AdamW (4 read + 3 written fp32), 20 B/elem for SGD, "
              "4 B/elem for sum_of_squares; memcpy counts read + write of the same total bytes.\n\n");
  std::printf("| size  | kernel                             |   ms     |  GB/s  | memcpy GB/s | of memcpy | torch ms | torch/fused |\n");
  std::printf("|------:|------------------------------------|---------:|-------:|-------:|------:|---------:|-------:|\n");
  for (int64_t s : sizes_m) bench_size(s << 20, s >= 64 ? 3 : (s >= 16 ? 5 : 20));
  return 0;
}
