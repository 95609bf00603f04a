// CpuIsa: what this x86 CPU can execute (cpuid + the OS's saved register state) and the
// theoretical FLOPs per cycle and core it implies per dtype, for MFU against the hardware.
#pragma once
#include <string>

namespace shardtrain {

struct CpuIsa {
  std::string vendor;      // "GenuineIntel", "AuthenticAMD", ... ("" off x86)
  std::string model_name;  // /proc/cpuinfo "model name"
  int family = 0, model = 0;
  // Usable features: the CPU reports them and the OS saves their registers (XCR0).
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512_bf16 = false;  // vdpbf16ps
  bool amx_bf16 = false;     // AMX tiles with bf16, and the kernel granted the tile state
  double clock_ghz = 0;      // the highest clock the OS reports (cpufreq max, else cpu MHz)
  bool avx512() const { return avx512f && avx512bw && avx512dq && avx512vl; }
  // "avx512+bf16+amx", "avx2+fma", "sse" ...
  std::string isa_name() const;
};

// Read once; the same answer on every call.
const CpuIsa& cpu_isa();
// The detection itself, from cpuid, xgetbv and /proc, /sys (cpu_isa() caches it).
CpuIsa detect_cpu_isa();

// Theoretical FLOPs per cycle per core for a GEMM in `dtype` ("fp32" or "bf16"), assuming two
// FMA units per core for the widest vectors (every AVX-512 Xeon Gold/Platinum and later, and
// every AVX2 core from Haswell and Zen 2 on): AVX-512 fp32 2x16x2 = 64, AVX2 2x8x2 = 32,
// AVX 2x8 = 16 and SSE 2x4 = 8 (a multiply and an add port, no FMA); bf16: AMX 1024 (TDPBF16PS, 16x16x32 per 16 cycles), AVX512-BF16 128
// (vdpbf16ps: 32 products and 32 adds per unit), otherwise converted to fp32 (the fp32 figure).
double flops_per_cycle(const CpuIsa& isa, const std::string& dtype);
// cores x clock x flops_per_cycle in TFLOP/s; 0 when the clock is unknown.
double theoretical_peak_tflops(const CpuIsa& isa, const std::string& dtype, int cores);

}  // namespace shardtrain
