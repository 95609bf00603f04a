// CpuIsa detection (cpuid, xgetbv, the AMX tile permission) and the theoretical FLOPs per cycle.
#include "shardtrain/util/cpu_isa.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define ST_X86 1
#endif

namespace shardtrain {
namespace {

#ifdef ST_X86
uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
// Linux gives a process the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM);
// oneDNN asks the same way. Without it AMX instructions fault, so "granted" is the test.
bool amx_permitted() {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

std::string cpuinfo_field(const char* key) {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(f, line)) {
    if (line.compare(0, n, key) != 0) continue;
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string v = line.substr(colon + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    return v;
  }
  return "";
}

double read_clock_ghz() {
  std::ifstream f("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");  // kHz
  double khz = 0;
  if (f >> khz && khz > 0) return khz / 1e6;
  const std::string mhz = cpuinfo_field("cpu MHz");
  return mhz.empty() ? 0 : std::atof(mhz.c_str()) / 1e3;
}

}  // namespace

std::string CpuIsa::isa_name() const {
  std::string s = avx512() ? "avx512" : avx2 ? "avx2" : avx ? "avx" : "sse";
  if (avx2 && fma && !avx512()) s += "+fma";
  if (avx512_bf16) s += "+bf16";
  if (amx_bf16) s += "+amx";
  return s;
}

CpuIsa detect_cpu_isa() {
  CpuIsa c;
  c.model_name = cpuinfo_field("model name");
  c.clock_ghz = read_clock_ghz();
#ifdef ST_X86
  unsigned a = 0, b = 0, cx = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &cx, &d)) return c;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &cx, 4);
  c.vendor = vendor;
  __get_cpuid(1, &a, &b, &cx, &d);
  const unsigned base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
  c.family = static_cast<int>(base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family);
  c.model = static_cast<int>((base_family == 0x6 || base_family == 0xf) ? base_model | (((a >> 16) & 0xf) << 4)
                                                                         : base_model);
  const bool osxsave = cx & (1u << 27);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6, tiles = (xcr0 & 0x60000) == 0x60000;
  c.avx = ymm && (cx & (1u << 28));
  c.fma = c.avx && (cx & (1u << 12));
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, cx, d);
    c.avx2 = c.avx && (b & (1u << 5));
    c.avx512f = zmm && (b & (1u << 16));
    c.avx512dq = c.avx512f && (b & (1u << 17));
    c.avx512bw = c.avx512f && (b & (1u << 30));
    c.avx512vl = c.avx512f && (b & (1u << 31));
    const bool amx_cpu = (d & (1u << 22)) && (d & (1u << 24));  // AMX-BF16, AMX-TILE
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    __cpuid_count(7, 1, a1, b1, c1, d1);
    c.avx512_bf16 = c.avx512f && (a1 & (1u << 5));
    c.amx_bf16 = amx_cpu && tiles && amx_permitted();
  }
#endif
  return c;
}

const CpuIsa& cpu_isa() {
  static const CpuIsa isa = detect_cpu_isa();
  return isa;
}

double flops_per_cycle(const CpuIsa& isa, const std::string& dtype) {
  const double fp32 = isa.avx512() ? 64 : (isa.avx2 && isa.fma) ? 32 : isa.avx ? 16 : 8;
  if (dtype == "bf16") {
    if (isa.amx_bf16) return 1024;
    if (isa.avx512_bf16) return 128;
  }
  return fp32;
}

double theoretical_peak_tflops(const CpuIsa& isa, const std::string& dtype, int cores) {
  return cores * isa.clock_ghz * flops_per_cycle(isa, dtype) / 1e3;
}

}  // namespace shardtrain
