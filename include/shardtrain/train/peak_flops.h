// Measured peak matmul throughput of this rank, the denominator of MFU when the deck gives none.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace shardtrain::train {
// TFLOP/s of a square matmul in `dtype` on `device` (on the CPU with the current intra-op
// threads; ~0.3 s). A measured peak is below the datasheet's: set log.peak_tflops for MFU
// against the datasheet.
double measure_peak_tflops(at::ScalarType dtype, const c10::Device& device = c10::kCPU);
}  // namespace shardtrain::train
