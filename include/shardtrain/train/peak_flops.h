// Peak throughput per rank, the denominators of MFU: the measured matmul and the hardware's
// theoretical peak (CPU: cores x clock x FLOPs per cycle for the ISA and dtype).
#pragma once
#include <mpi.h>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace shardtrain::train {
// TFLOP/s of a square matmul in `dtype` on `device` (on the CPU with the current intra-op
// threads; ~0.3 s), through the kernels training uses: model::addmm, so a bf16 product on the CPU
// runs the path model::bf16_gemm() names (train/bf16_choice.h chooses it first).
double measure_peak_tflops(at::ScalarType dtype, const c10::Device& device = c10::kCPU);

// The CPU's theoretical peak for `threads` cores in `dtype` (util/cpu_isa.h: two FMA units per
// core, the clock the OS reports); 0 on a GPU device (no datasheet table: set log.peak_tflops).
double theoretical_peak_tflops(at::ScalarType dtype, const c10::Device& device, int threads);

// The MFU denominators of one run, agreed over `world` (slowest rank's matmul).
struct PeakFlops {
  double measured = 0;     // matmul TFLOP/s per rank (0 when the deck gives log.peak_tflops)
  double theoretical = 0;  // hardware peak per rank (0 when unknown)
  double deck = 0;         // log.peak_tflops (0 = unset)
  // The MFU denominator: the deck's figure, else the hardware's (theoretical, or the measured
  // matmul where that is higher: the OS may report a clock below the one the core runs at).
  double hardware() const;
  std::string source() const;  // "log.peak_tflops", "theoretical", "measured matmul"
  // One start-up line: both figures and their ratio.
  std::string describe() const;
  // Non-empty when the measured matmul reaches less than half of the theoretical peak.
  std::string warning() const;
};
PeakFlops peak_flops(double deck_peak_tflops, at::ScalarType dtype, const c10::Device& device, int threads,
                     MPI_Comm world);
}  // namespace shardtrain::train
