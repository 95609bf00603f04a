// measure_peak_tflops (best of a few timed square matmuls), the CPU's theoretical peak, and the
// PeakFlops pair the trainer divides by.
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/train/peak_flops.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>

#include "shardtrain/fsdp/device.h"
#include "shardtrain/model/bf16_gemm.h"
#include "shardtrain/util/cpu_isa.h"
#include "shardtrain/util/timer.h"

namespace shardtrain::train {
double measure_peak_tflops(at::ScalarType dtype, const c10::Device& device) {
  // A GPU finishes a 1024^3 matmul in microseconds (launch-bound): time 8192^3 there.
  const int64_t n = device.is_cuda() ? 8192 : 1024;
  const int reps = device.is_cuda() ? 10 : 4;
  const at::TensorOptions o = at::TensorOptions().device(device);
  at::Tensor a = at::randn({n, n}, o).to(dtype), b = at::randn({n, n}, o).to(dtype);
  // The models' own GEMM dispatch (model/bf16_gemm.h): a bf16 product on the CPU takes the path
  // chosen at start-up (libtorch's bf16 kernel, or fp32 on the bf16 operands, conversions timed).
  auto product = [&] { return model::addmm(at::Tensor(), a, b); };
  at::Tensor c = product();  // warm-up (kernel selection, allocator)
  fsdp::synchronize_device(device);
  double best = 0;
  for (int i = 0; i < reps; ++i) {
    Timer t;
    c = product();
    fsdp::synchronize_device(device);
    best = std::max(best, 2.0 * n * n * n / t.seconds() / 1e12);
  }
  return best;
}

double theoretical_peak_tflops(at::ScalarType dtype, const c10::Device& device, int threads) {
  if (device.is_cuda()) return 0;
  return shardtrain::theoretical_peak_tflops(cpu_isa(), dtype == at::kBFloat16 ? "bf16" : "fp32", threads);
}

double PeakFlops::hardware() const { return deck > 0 ? deck : std::max(theoretical, measured); }

std::string PeakFlops::source() const {
  if (deck > 0) return "log.peak_tflops";
  return theoretical >= measured ? "theoretical" : "measured matmul";
}

std::string PeakFlops::describe() const {
  char buf[320];
  if (deck > 0) {
    std::snprintf(buf, sizeof buf, "peak %.3f TFLOP/s per rank (log.peak_tflops); theoretical %.3f", deck, theoretical);
  } else if (theoretical > 0) {
    std::snprintf(buf, sizeof buf,
                  "peak per rank: theoretical %.3f TFLOP/s (%s), measured matmul %.3f (%.0f%% of it); MFU against %s",
                  theoretical, cpu_isa().isa_name().c_str(), measured, 100 * measured / theoretical,
                  measured > theoretical ? "the measured matmul (above the theoretical at the reported clock)"
                                         : "the theoretical");
  } else {
    std::snprintf(buf, sizeof buf, "peak %.3f TFLOP/s per rank (measured matmul; theoretical unknown)", measured);
  }
  return buf;
}

std::string PeakFlops::warning() const {
  if (measured <= 0 || theoretical <= 0 || measured >= 0.5 * theoretical) return "";
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "the measured matmul reaches %.0f%% of the theoretical peak (%.3f of %.3f TFLOP/s per rank): "
                "a slow GEMM kernel or oversubscribed cores (see docs/troubleshooting.md, slow steps on a CPU)",
                100 * measured / theoretical, measured, theoretical);
  return buf;
}

PeakFlops peak_flops(double deck_peak_tflops, at::ScalarType dtype, const c10::Device& device, int threads,
                     MPI_Comm world) {
  PeakFlops p;
  p.deck = deck_peak_tflops;
  p.theoretical = theoretical_peak_tflops(dtype, device, threads);
  if (p.deck <= 0) {  // the slowest rank's measured matmul rate
    p.measured = runtime::min(world, measure_peak_tflops(dtype, device), "setup.peak_flops");
  }
  return p;
}
}  // namespace shardtrain::train
