// GEMM kernel selection at start-up: which BLAS libtorch's fp32 GEMMs run on, OpenBLAS's core
// (kernel set), and the switch to a better core when OpenBLAS fell back to a generic one.
//
// OpenBLAS (DYNAMIC_ARCH) picks its core once, when the library loads, from cpuid and
// OPENBLAS_CORETYPE. Debian's 0.3.21 does not know recent Xeons (family 6 model 207) and runs
// its Prescott (SSE3) kernels there, ~4x below the machine. select_blas_kernel() then switches
// OpenBLAS, in this process and before the first BLAS call that matters, to the best core the
// CPU's instruction set allows, the way OpenBLAS's own load-time initialisation does it with
// OPENBLAS_CORETYPE set (no re-exec, no environment variable for the user). The decision depends
// only on cpuid, the environment and the core OpenBLAS reports, so every rank of a job makes the
// same one. An explicit OPENBLAS_CORETYPE is never overridden; SHARDTRAIN_BLAS_SELECT=off
// disables the switch. The running kernel is checked once against an fp64 reference; a selected
// kernel that fails is dropped (OpenBLAS's own choice again). See docs/performance.md.
#pragma once
#include <string>

#include "shardtrain/util/cpu_isa.h"

namespace shardtrain::runtime {

struct BlasKernel {
  std::string library;       // the shared object that defines sgemm_ ("" when no BLAS is loaded)
  std::string config;        // openblas_get_config(), "" for another BLAS
  std::string core;          // openblas_get_corename(): the kernel set running now
  std::string autodetected;  // the core OpenBLAS chose on its own ("" when unknown)
  // autodetected | selected | user | disabled | rejected | single-core build | not OpenBLAS | no BLAS
  std::string decision;
  std::string reason;        // one sentence: why this kernel runs
  double gflops = 0;           // 512^3 sgemm on one thread, best of 3
  double fallback_gflops = 0;  // the autodetected core's, measured before the switch (0 without one)
  double max_rel_error = 0;    // max |C - C_fp64| / sum_k |a_ik b_kj| of a 192^3 product
  double error_bound = 0;      // the bound any correct fp32 summation order meets (K u / (1 - K u))
  bool checked = false, accurate = true;
  // One log line: library, core, decision and why, GFLOP/s, the accuracy check.
  std::string line() const;
};

// OpenBLAS core names grouped by the widest vector ISA their GEMM kernels use:
// 0 = SSE (Prescott, Core2, Nehalem, Atom, ... and unknown names), 1 = AVX (Sandybridge,
// Bulldozer family), 2 = AVX2+FMA (Haswell, Zen), 3 = AVX-512 (SkylakeX, Cooperlake, SapphireRapids).
int openblas_core_tier(const std::string& core);
// The core to select for this CPU: "SkylakeX" (AVX-512), "Zen" (AMD with AVX2+FMA), "Haswell"
// (AVX2+FMA), "" (nothing better than what any core runs).
std::string best_openblas_core(const CpuIsa& isa);

// The pure decision, for tests: given the environment and the running core, keep it or switch
// to `core`. `user_coretype` / `switch_value` are the environment's values (nullptr = unset).
struct BlasPlan {
  bool change = false;
  std::string core;      // the core to switch to (an OPENBLAS_CORETYPE name)
  std::string decision;  // as BlasKernel::decision when kept
  std::string reason;
};
BlasPlan plan_blas_selection(const char* user_coretype, const char* switch_value, const std::string& running_core,
                             bool dynamic_arch, const CpuIsa& isa);

// Call first thing in main() of a program that computes (train, plan --measure, maxbatch, bench,
// info), before MPI_Init and before any other BLAS call: may switch OpenBLAS's core. Fills
// blas_kernel(). Thread-unsafe: call while the process has one thread (no BLAS call may run
// concurrently with the switch).
void select_blas_kernel();
// The result of select_blas_kernel() (decision "" when it was not called).
const BlasKernel& blas_kernel();

// The accuracy check alone: an n^3 sgemm_ against the fp64 product of the same fp32 inputs.
// Returns max |C - C_ref| / sum_k |a_ik b_kj|; `bound` receives n u / (1 - n u), u = 2^-24.
// -1 when no sgemm_ is loaded.
double sgemm_max_rel_error(int n, double* bound);
// GFLOP/s of an n^3 sgemm_ on one BLAS thread, best of `reps` after one warm-up (0 without BLAS).
double sgemm_gflops(int n, int reps);

}  // namespace shardtrain::runtime
