// sum_of_squares (chunked, double accumulators) and scale, as Kokkos loops.
#include "shardtrain/optim/reductions.h"

#include <algorithm>

#include "flat_loop.h"

namespace shardtrain::optim {
namespace {

// A plain double reduction is one serial chain of adds (the compiler may not reorder them),
// which runs far below memory bandwidth. Reducing chunks with eight independent accumulators
// lets the adds overlap and vectorise while keeping every product and sum in double.
constexpr long kChunk = 4096;
constexpr int kLanes = 8;

struct SumOfSquaresChunk {
  const float* x;
  long n;

  KOKKOS_INLINE_FUNCTION void operator()(const long chunk, double& total) const {
    const long begin = chunk * kChunk;
    const long end = std::min(begin + kChunk, n);
    double lane[kLanes] = {};
    long i = begin;
    for (; i + kLanes <= end; i += kLanes)
      for (int k = 0; k < kLanes; ++k) {
        const double v = x[i + k];
        lane[k] += v * v;
      }
    for (; i < end; ++i) {
      const double v = x[i];
      lane[0] += v * v;
    }
    total += ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
};

struct ScaleKernel {
  float* x;
  float factor;
  KOKKOS_INLINE_FUNCTION void operator()(const long i) const { x[i] = x[i] * factor; }
};

}  // namespace

double sum_of_squares(const float* x, int64_t n) {
  detail::require_kokkos("sum_of_squares");
  ST_CHECK(n >= 0, "negative length ", n);
  if (n == 0) return 0.0;
  ST_CHECK(x, "sum_of_squares given a null array");
  const long chunks = static_cast<long>((n + kChunk - 1) / kChunk);
  double total = 0.0;
  Kokkos::parallel_reduce("sum_of_squares", detail::flat_policy(0, chunks),
                          SumOfSquaresChunk{x, static_cast<long>(n)}, total);
  return total;
}

void scale(float* x, int64_t n, float factor) {
  detail::require_kokkos("scale");
  ST_CHECK(n >= 0, "negative length ", n);
  if (n == 0) return;
  ST_CHECK(x, "scale given a null array");
  Kokkos::parallel_for("scale", detail::flat_policy(0, n), ScaleKernel{x, factor});
}

}  // namespace shardtrain::optim
