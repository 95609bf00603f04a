// measure_peak_tflops: best of a few timed 1024^3 matmuls.
#include "shardtrain/train/peak_flops.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "shardtrain/util/timer.h"

namespace shardtrain::train {
double measure_peak_tflops(at::ScalarType dtype) {
  const int64_t n = 1024;
  at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  at::Tensor c = at::matmul(a, b);  // warm-up
  double best = 0;
  for (int i = 0; i < 4; ++i) {
    Timer t;
    c = at::matmul(a, b);
    best = std::max(best, 2.0 * n * n * n / t.seconds() / 1e12);
  }
  return best;
}
}  // namespace shardtrain::train
