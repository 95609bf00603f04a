// Measured peak matmul throughput of this rank, the denominator of MFU when the deck gives none.
#pragma once
#include <c10/core/ScalarType.h>

namespace shardtrain::train {
// TFLOP/s of a square matmul in `dtype` with the current intra-op threads (~0.3 s).
double measure_peak_tflops(at::ScalarType dtype);
}  // namespace shardtrain::train
