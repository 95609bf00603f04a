// select_blas_kernel(): find the BLAS and its OpenBLAS core, switch OpenBLAS to a better core
// (in this process) when it fell back to a generic one, check the running kernel against fp64 once.
#include "shardtrain/runtime/blas_kernel.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shardtrain/util/log.h"

namespace shardtrain::runtime {
namespace {

constexpr const char* kSwitch = "SHARDTRAIN_BLAS_SELECT";              // off | 0 | anything else: select
constexpr const char* kSimulate = "SHARDTRAIN_BLAS_SIMULATE_FALLBACK";  // tests: force a fallback core
constexpr const char* kSimulateWrong = "SHARDTRAIN_BLAS_SIMULATE_WRONG";  // tests: this core's check fails

BlasKernel g_kernel;

using SgemmFn = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                         const int*, const float*, const int*, const float*, float*, const int*);
using CharFn = char* (*)();
using IntFn = int (*)();
using SetIntFn = void (*)(int);
using VoidFn = void (*)();

template <typename F>
F sym(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t e; (e = s.find(sep, b)) != std::string::npos; b = e + 1) out.push_back(s.substr(b, e - b));
  out.push_back(s.substr(b));
  return out;
}

// Runs `f` with OpenBLAS on one thread (the measured figure is per core), then restores.
template <typename F>
auto one_blas_thread(F f) {
  auto get = sym<IntFn>("openblas_get_num_threads");
  auto set = sym<SetIntFn>("openblas_set_num_threads");
  const int before = get ? get() : 0;
  if (set) set(1);
  auto r = f();
  if (set && before > 0) set(before);
  return r;
}

void fill(std::vector<float>& v, uint64_t seed) {
  for (float& x : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int64_t>(seed >> 40) - (1 << 23)) / float(1 << 23);  // [-1, 1)
  }
}

// Makes `core` OpenBLAS's running kernel set ("" = the one it chooses itself from cpuid), in
// this process, by what the library's own load-time constructor runs: gotoblas_dynamic_quit()
// clears its core table pointer (`gotoblas`), gotoblas_dynamic_init() sets it again from
// OPENBLAS_CORETYPE, or from cpuid when that is unset, and initialises that core's blocking
// parameters. Both are exported by every DYNAMIC_ARCH build's shared library. Afterwards the
// process computes exactly as one started with OPENBLAS_CORETYPE=<core> (test_blas_kernel checks
// the bits); the environment is left as it was. Only safe while no BLAS call is running: call it
// while the process has one thread. Returns "" or why the switch is not possible.
std::string switch_core(const std::string& core) {
  auto quit = sym<VoidFn>("gotoblas_dynamic_quit");
  auto init = sym<VoidFn>("gotoblas_dynamic_init");
  auto corename = sym<CharFn>("openblas_get_corename");
  if (!quit || !init || !corename) return "this OpenBLAS does not export gotoblas_dynamic_init/quit";
  const char* prev = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = prev ? prev : "";
  if (core.empty()) unsetenv("OPENBLAS_CORETYPE");
  else setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  quit();
  init();
  if (prev) setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  else unsetenv("OPENBLAS_CORETYPE");
  const std::string now = corename();
  if (!core.empty() && lower(now) != lower(core)) return "OpenBLAS runs " + now + " after selecting " + core;
  return "";
}

void check_and_measure(BlasKernel& k) {
  k.max_rel_error = sgemm_max_rel_error(192, &k.error_bound);
  const char* wrong = std::getenv(kSimulateWrong);  // tests: stand in for a kernel with a bug
  if (wrong && !k.core.empty() && lower(wrong) == lower(k.core)) k.max_rel_error = 1e-3;
  k.checked = k.max_rel_error >= 0;
  k.accurate = !k.checked || k.max_rel_error <= k.error_bound;
  k.gflops = sgemm_gflops(512, 3);
}

}  // namespace

int openblas_core_tier(const std::string& core) {
  const std::string c = lower(core);
  for (const char* n : {"skylakex", "cooperlake", "sapphirerapids"})
    if (c == n) return 3;
  for (const char* n : {"haswell", "zen", "excavator", "steamroller", "alderlake"})
    if (c == n) return 2;
  for (const char* n : {"sandybridge", "bulldozer", "piledriver"})
    if (c == n) return 1;
  return 0;  // Prescott, Core2, Penryn, Dunnington, Nehalem, Atom, Opteron, Barcelona, ... unknown
}

std::string best_openblas_core(const CpuIsa& isa) {
  if (isa.avx512()) return "SkylakeX";
  if (isa.avx2 && isa.fma) return isa.vendor == "AuthenticAMD" ? "Zen" : "Haswell";
  return "";
}

BlasPlan plan_blas_selection(const char* user_coretype, const char* switch_value, const std::string& running_core,
                             bool dynamic_arch, const CpuIsa& isa) {
  BlasPlan p;
  if (user_coretype && *user_coretype) {
    p.decision = "user";
    p.reason = std::string("OPENBLAS_CORETYPE=") + user_coretype + " is set: never overridden";
    return p;
  }
  const std::string sw = switch_value ? lower(switch_value) : "";
  if (sw == "off" || sw == "0" || sw == "false" || sw == "no") {
    p.decision = "disabled";
    p.reason = std::string(kSwitch) + "=" + switch_value + ": OpenBLAS's own choice runs";
    return p;
  }
  const std::string best = best_openblas_core(isa);
  const int have = openblas_core_tier(running_core), want = best.empty() ? 0 : openblas_core_tier(best);
  if (have >= want) {
    p.decision = "autodetected";
    p.reason = "OpenBLAS's own choice fits this CPU (" + isa.isa_name() + ")";
    return p;
  }
  if (!dynamic_arch) {
    p.decision = "single-core build";
    p.reason = "this OpenBLAS is built for " + running_core + " only (no DYNAMIC_ARCH); a " + best +
               " build would be faster on this CPU (" + isa.isa_name() + ")";
    return p;
  }
  p.change = true;
  p.core = best;
  p.decision = "selected";
  p.reason = "OpenBLAS chose " + running_core + " on a CPU with " + isa.isa_name();
  return p;
}

double sgemm_max_rel_error(int n, double* bound) {
  auto sgemm = sym<SgemmFn>("sgemm_");
  if (!sgemm) return -1;
  std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n, 0.f);
  fill(a, 1);
  fill(b, 2);
  const float one = 1, zero = 0;
  one_blas_thread([&] {
    sgemm("N", "N", &n, &n, &n, &one, a.data(), &n, b.data(), &n, &zero, c.data(), &n);
    return 0;
  });
  double worst = 0;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < n; ++i) {  // column-major: C(i,j) = sum_k A(i,k) B(k,j)
      double ref = 0, mag = 0;
      for (int k = 0; k < n; ++k) {
        const double p = double(a[size_t(k) * n + i]) * double(b[size_t(j) * n + k]);
        ref += p;
        mag += std::fabs(p);
      }
      const double err = std::fabs(double(c[size_t(j) * n + i]) - ref) / std::max(mag, 1e-300);
      if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;  // NaN counts as wrong
    }
  const double u = std::ldexp(1.0, -24);
  if (bound) *bound = n * u / (1 - n * u);
  return worst;
}

double sgemm_gflops(int n, int reps) {
  auto sgemm = sym<SgemmFn>("sgemm_");
  if (!sgemm) return 0;
  std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  fill(a, 3);
  fill(b, 4);
  const float one = 1, zero = 0;
  return one_blas_thread([&] {
    double best = 0;
    for (int r = 0; r <= reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      sgemm("N", "N", &n, &n, &n, &one, a.data(), &n, b.data(), &n, &zero, c.data(), &n);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) best = std::max(best, 2.0 * n * n * n / s / 1e9);
    }
    return best;
  });
}

std::string BlasKernel::line() const {
  char buf[160];
  std::string s = "# BLAS ";
  if (decision == "no BLAS") return s + "none loaded";
  s += config.empty() ? library : config.substr(0, config.find(' ', config.find(' ') + 1));
  if (!core.empty()) s += ", core " + core;
  s += " (" + decision + ": " + reason + ")";
  std::snprintf(buf, sizeof buf, "; sgemm %.1f GFLOP/s on 1 thread", gflops);
  s += buf;
  if (fallback_gflops > 0) {
    std::snprintf(buf, sizeof buf, " (%s: %.1f, %.2fx)", autodetected.c_str(), fallback_gflops, gflops / fallback_gflops);
    s += buf;
  }
  if (checked) {
    std::snprintf(buf, sizeof buf, "; fp64 check %s (max rel. error %.1e, bound %.1e)", accurate ? "ok" : "FAILED",
                  max_rel_error, error_bound);
    s += buf;
  }
  return s;
}

const BlasKernel& blas_kernel() { return g_kernel; }

void select_blas_kernel() {
  BlasKernel& k = g_kernel;
  k = BlasKernel{};
  void* sg = dlsym(RTLD_DEFAULT, "sgemm_");
  if (!sg) {
    k.decision = "no BLAS";
    k.reason = "no sgemm_ in the process";
    return;
  }
  Dl_info dli{};
  if (dladdr(sg, &dli) && dli.dli_fname) k.library = dli.dli_fname;
  auto corename = sym<CharFn>("openblas_get_corename");
  auto config = sym<CharFn>("openblas_get_config");
  if (!corename) {
    k.decision = "not OpenBLAS";
    k.reason = "no kernel selection for this BLAS";
    check_and_measure(k);
    return;
  }
  if (config) k.config = config();
  const bool dynamic = k.config.find("DYNAMIC_ARCH") != std::string::npos;
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  // Tests: a fallback core stands in for OpenBLAS's own choice (never over a user's setting).
  const char* simulate = std::getenv(kSimulate);
  const bool simulated = !coretype && simulate && *simulate && dynamic && switch_core(simulate).empty();
  k.core = k.autodetected = corename();
  const BlasPlan plan = plan_blas_selection(coretype, std::getenv(kSwitch), k.core, dynamic, cpu_isa());
  k.decision = plan.decision;
  k.reason = plan.reason;
  if (simulated) k.reason += " (fallback simulated by " + std::string(kSimulate) + ")";
  if (!plan.change) {
    check_and_measure(k);
    return;
  }
  k.fallback_gflops = sgemm_gflops(512, 1);  // the autodetected core's speed, for the line
  const std::string why_not = switch_core(plan.core);
  k.core = corename();
  if (!why_not.empty()) {
    k.decision = "autodetected";
    k.reason += "; " + plan.core + " not selected: " + why_not + " (export OPENBLAS_CORETYPE=" + plan.core + ")";
    k.fallback_gflops = 0;
    check_and_measure(k);
    return;
  }
  check_and_measure(k);
  if (!k.accurate) {  // never keep a selected kernel that computes wrong results
    const std::string failed = k.core;
    switch_core(simulated ? std::string(simulate) : std::string());
    k.core = corename();
    k.decision = "rejected";
    k.reason = "the " + failed + " kernel failed the fp64 check; OpenBLAS's own choice runs";
    k.fallback_gflops = 0;
    check_and_measure(k);
  }
}

}  // namespace shardtrain::runtime
