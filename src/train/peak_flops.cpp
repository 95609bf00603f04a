// measure_peak_tflops: best of a few timed square matmuls on the compute device.
#include "shardtrain/train/peak_flops.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "shardtrain/fsdp/device.h"
#include "shardtrain/util/timer.h"

namespace shardtrain::train {
double measure_peak_tflops(at::ScalarType dtype, const c10::Device& device) {
  // A GPU finishes a 1024^3 matmul in microseconds (launch-bound): time 8192^3 there.
  const int64_t n = device.is_cuda() ? 8192 : 1024;
  const int reps = device.is_cuda() ? 10 : 4;
  const at::TensorOptions o = at::TensorOptions().device(device);
  at::Tensor a = at::randn({n, n}, o).to(dtype), b = at::randn({n, n}, o).to(dtype);
  at::Tensor c = at::matmul(a, b);  // warm-up (kernel selection, allocator)
  fsdp::synchronize_device(device);
  double best = 0;
  for (int i = 0; i < reps; ++i) {
    Timer t;
    c = at::matmul(a, b);
    fsdp::synchronize_device(device);
    best = std::max(best, 2.0 * n * n * n / t.seconds() / 1e12);
  }
  return best;
}
}  // namespace shardtrain::train
