// GEMM kernel selection (runtime/blas_kernel.h): the decision table, the fp64 accuracy check,
// and whole processes under the default, a forced fallback, a user's OPENBLAS_CORETYPE, the off
// switch, a kernel that fails its check, and mpirun; the in-process core switch computes the same
// bits as OPENBLAS_CORETYPE set before the library loaded.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "shardtrain/runtime/blas_kernel.h"
#include "shardtrain/util/cpu_isa.h"

using namespace shardtrain;
using runtime::BlasPlan;
using runtime::plan_blas_selection;

namespace {
CpuIsa isa_avx512() {
  CpuIsa i;
  i.vendor = "GenuineIntel";
  i.avx = i.avx2 = i.fma = i.avx512f = i.avx512bw = i.avx512dq = i.avx512vl = true;
  return i;
}

using Kv = std::map<std::string, std::string>;
// Runs the driver with `env` (assignments for `env`; everything of ours unset first).
Kv run_driver(const std::string& env, const std::string& launcher = "") {
  // The default: no variable of ours set (selection is on without one).
  const std::string cmd = "env -u OPENBLAS_CORETYPE -u SHARDTRAIN_BLAS_SELECT "
                          "-u SHARDTRAIN_BLAS_SIMULATE_FALLBACK -u SHARDTRAIN_BLAS_SIMULATE_WRONG " +
                          env + " " + launcher + " " BLAS_DRIVER;
  FILE* p = popen(cmd.c_str(), "r");
  Kv kv;
  char line[1024];
  int n = 0;
  while (p && std::fgets(line, sizeof line, p)) {
    std::string s(line);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    const size_t eq = s.find('=');
    if (eq == std::string::npos) continue;
    std::string key = s.substr(0, eq);
    if (kv.count(key)) key += "#" + std::to_string(++n);  // a second rank's lines
    kv[key] = s.substr(eq + 1);
  }
  EXPECT_TRUE(p && pclose(p) == 0) << cmd;
  return kv;
}
}  // namespace

TEST(BlasPlan, FallbackOnAvx512SelectsSkylakeX) {
  const BlasPlan p = plan_blas_selection(nullptr, nullptr, "Prescott", true, isa_avx512());
  EXPECT_TRUE(p.change);
  EXPECT_EQ(p.core, "SkylakeX");
  EXPECT_EQ(p.decision, "selected");
  const BlasPlan h = plan_blas_selection(nullptr, nullptr, "Haswell", true, isa_avx512());
  EXPECT_TRUE(h.change);
  EXPECT_EQ(h.core, "SkylakeX");
}

TEST(BlasPlan, Avx2PicksHaswellOrZenByVendor) {
  CpuIsa i = isa_avx512();
  i.avx512f = false;
  EXPECT_EQ(plan_blas_selection(nullptr, nullptr, "Nehalem", true, i).core, "Haswell");
  i.vendor = "AuthenticAMD";
  EXPECT_EQ(plan_blas_selection(nullptr, nullptr, "Barcelona", true, i).core, "Zen");
  EXPECT_FALSE(plan_blas_selection(nullptr, nullptr, "Zen", true, i).change);
  i.avx2 = false;  // nothing better than SSE kernels
  EXPECT_FALSE(plan_blas_selection(nullptr, nullptr, "Prescott", true, i).change);
}

TEST(BlasPlan, GoodAutodetectionIsKept) {
  for (const char* c : {"SkylakeX", "Cooperlake", "SapphireRapids", "skylakex"}) {
    const BlasPlan p = plan_blas_selection(nullptr, nullptr, c, true, isa_avx512());
    EXPECT_FALSE(p.change) << c;
    EXPECT_EQ(p.decision, "autodetected") << c;
  }
}

TEST(BlasPlan, UserCoretypeAndSwitchAreRespected) {
  const BlasPlan u = plan_blas_selection("Prescott", nullptr, "Prescott", true, isa_avx512());
  EXPECT_FALSE(u.change);
  EXPECT_EQ(u.decision, "user");
  for (const char* off : {"off", "0", "OFF", "false", "no"}) {
    const BlasPlan d = plan_blas_selection(nullptr, off, "Prescott", true, isa_avx512());
    EXPECT_FALSE(d.change) << off;
    EXPECT_EQ(d.decision, "disabled") << off;
  }
  EXPECT_TRUE(plan_blas_selection(nullptr, "auto", "Prescott", true, isa_avx512()).change);
  const BlasPlan s = plan_blas_selection(nullptr, nullptr, "Prescott", false, isa_avx512());
  EXPECT_FALSE(s.change);  // OpenBLAS without DYNAMIC_ARCH ignores OPENBLAS_CORETYPE
  EXPECT_EQ(s.decision, "single-core build");
}

TEST(BlasCoreTier, NamesGroupByIsa) {
  EXPECT_EQ(runtime::openblas_core_tier("Prescott"), 0);
  EXPECT_EQ(runtime::openblas_core_tier("Sandybridge"), 1);
  EXPECT_EQ(runtime::openblas_core_tier("Haswell"), 2);
  EXPECT_EQ(runtime::openblas_core_tier("Zen"), 2);
  EXPECT_EQ(runtime::openblas_core_tier("SkylakeX"), 3);
  EXPECT_EQ(runtime::openblas_core_tier("Cooperlake"), 3);
  EXPECT_EQ(runtime::openblas_core_tier("no such core"), 0);
}

TEST(BlasCheck, LoadedKernelMeetsTheFp32Bound) {
  at::mm(at::ones({2, 2}), at::ones({2, 2}));  // libtorch (and its BLAS) linked in and loaded
  double bound = 0;
  const double err = runtime::sgemm_max_rel_error(192, &bound);
  ASSERT_GE(err, 0) << "no sgemm_ in the test process";
  EXPECT_GT(bound, 1e-5);
  EXPECT_LT(bound, 1.2e-5);  // 192 x 2^-24
  EXPECT_LE(err, bound);
  EXPECT_GT(err, 0);  // fp32 rounding is visible against fp64: the comparison is real
  EXPECT_GT(runtime::sgemm_gflops(128, 1), 0);
}

TEST(CpuIsa, PeakFollowsTheIsa) {
  CpuIsa i = isa_avx512();
  i.clock_ghz = 2.0;
  EXPECT_DOUBLE_EQ(flops_per_cycle(i, "fp32"), 64);
  EXPECT_DOUBLE_EQ(flops_per_cycle(i, "bf16"), 64);  // no avx512_bf16: converted to fp32
  i.avx512_bf16 = true;
  EXPECT_DOUBLE_EQ(flops_per_cycle(i, "bf16"), 128);
  i.amx_bf16 = true;
  EXPECT_DOUBLE_EQ(flops_per_cycle(i, "bf16"), 1024);
  EXPECT_DOUBLE_EQ(theoretical_peak_tflops(i, "fp32", 4), 4 * 2.0 * 64 / 1e3);
  i.avx512f = false;
  EXPECT_DOUBLE_EQ(flops_per_cycle(i, "fp32"), 32);
  const CpuIsa& here = cpu_isa();
  EXPECT_FALSE(here.model_name.empty());
  EXPECT_GT(flops_per_cycle(here, "fp32"), 0);
}

// Whole processes: the driver selects like main() does.
TEST(BlasProcess, Default) {
  Kv kv = run_driver("");
  const std::string best = runtime::best_openblas_core(cpu_isa());
  if (kv["library"].empty()) GTEST_SKIP() << "no BLAS";
  if (kv["decision"] == "not OpenBLAS") GTEST_SKIP() << "BLAS is not OpenBLAS: " << kv["library"];
  EXPECT_TRUE(kv["decision"] == "selected" || kv["decision"] == "autodetected") << kv["line"];
  if (!best.empty()) EXPECT_GE(runtime::openblas_core_tier(kv["running"]), runtime::openblas_core_tier(best));
  EXPECT_EQ(kv["core"], kv["running"]);
  EXPECT_EQ(kv["accurate"], "1");
  EXPECT_EQ(kv["coretype_env"], "");  // the switch leaves the environment as it was
}

TEST(BlasProcess, ForcedFallbackSelectsTheBetterCore) {
  const std::string best = runtime::best_openblas_core(cpu_isa());
  Kv kv = run_driver("SHARDTRAIN_BLAS_SIMULATE_FALLBACK=Prescott");
  if (kv["decision"] == "not OpenBLAS" || kv["library"].empty()) GTEST_SKIP() << "not OpenBLAS";
  if (best.empty()) {
    EXPECT_EQ(kv["running"], "Prescott");
    return;
  }
  EXPECT_EQ(kv["decision"], "selected") << kv["line"];
  EXPECT_EQ(kv["autodetected"], "Prescott");
  EXPECT_EQ(runtime::openblas_core_tier(kv["running"]), runtime::openblas_core_tier(best)) << kv["line"];
  EXPECT_GT(std::stod(kv["fallback_gflops"]), 0);  // measured on the fallback before the switch
  EXPECT_EQ(kv["accurate"], "1");
  EXPECT_EQ(kv["coretype_env"], "");
  EXPECT_NE(kv["line"].find("core " + kv["running"] + " (selected"), std::string::npos) << kv["line"];
}

TEST(BlasProcess, UserCoretypeIsNeverOverridden) {
  Kv kv = run_driver("OPENBLAS_CORETYPE=Prescott");
  if (kv["decision"] == "not OpenBLAS" || kv["library"].empty()) GTEST_SKIP() << "not OpenBLAS";
  EXPECT_EQ(kv["decision"], "user");
  EXPECT_EQ(kv["running"], "Prescott");
  EXPECT_EQ(kv["accurate"], "1");
}

TEST(BlasProcess, SwitchOffKeepsTheFallback) {
  Kv kv = run_driver("SHARDTRAIN_BLAS_SIMULATE_FALLBACK=Prescott SHARDTRAIN_BLAS_SELECT=off");
  if (kv["decision"] == "not OpenBLAS" || kv["library"].empty()) GTEST_SKIP() << "not OpenBLAS";
  EXPECT_EQ(kv["decision"], "disabled");
  EXPECT_EQ(kv["running"], "Prescott");
}

TEST(BlasProcess, AKernelThatFailsTheCheckIsDropped) {
  const std::string best = runtime::best_openblas_core(cpu_isa());
  if (best.empty()) GTEST_SKIP() << "nothing to select on this CPU";
  Kv kv = run_driver("SHARDTRAIN_BLAS_SIMULATE_FALLBACK=Prescott SHARDTRAIN_BLAS_SIMULATE_WRONG=" + best);
  if (kv["decision"] == "not OpenBLAS" || kv["library"].empty()) GTEST_SKIP() << "not OpenBLAS";
  EXPECT_EQ(kv["decision"], "rejected") << kv["line"];
  EXPECT_NE(kv["reason"].find(best + " kernel failed"), std::string::npos) << kv["reason"];
  EXPECT_EQ(kv["running"], "Prescott");  // back on the (simulated) choice of OpenBLAS
  EXPECT_EQ(kv["accurate"], "1");
}

// The switch in the process is what OpenBLAS does at load with OPENBLAS_CORETYPE set: the same
// bits through sgemm_ and through libtorch as a process started with the core exported.
TEST(BlasProcess, TheSwitchComputesTheBitsOfTheExportedCore) {
  const std::string best = runtime::best_openblas_core(cpu_isa());
  if (best.empty()) GTEST_SKIP() << "nothing to select on this CPU";
  Kv sw = run_driver("SHARDTRAIN_BLAS_SIMULATE_FALLBACK=Prescott");
  if (sw["decision"] == "not OpenBLAS" || sw["library"].empty()) GTEST_SKIP() << "not OpenBLAS";
  ASSERT_EQ(sw["decision"], "selected") << sw["line"];
  Kv ex = run_driver("OPENBLAS_CORETYPE=" + sw["running"]);
  ASSERT_EQ(ex["decision"], "user");
  ASSERT_EQ(ex["running"], sw["running"]);
  EXPECT_EQ(sw["sgemm_bits"], ex["sgemm_bits"]);
  EXPECT_EQ(sw["torch_bits"], ex["torch_bits"]);
  Kv dflt = run_driver("");  // the default process runs the same kernel set (selected or autodetected)
  if (dflt["running"] == sw["running"]) {
    EXPECT_EQ(dflt["sgemm_bits"], sw["sgemm_bits"]);
  }
  // The comparison is real: Prescott's kernels sum in another order and give other bits.
  Kv pr = run_driver("OPENBLAS_CORETYPE=Prescott");
  EXPECT_EQ(pr["running"], "Prescott");
  EXPECT_NE(pr["sgemm_bits"], sw["sgemm_bits"]);
}

TEST(BlasProcess, EveryMpiRankDecidesTheSame) {
  Kv kv = run_driver("SHARDTRAIN_BLAS_SIMULATE_FALLBACK=Prescott",
                     MPIEXEC " --allow-run-as-root --oversubscribe --bind-to none -np 2");
  std::vector<std::string> cores, decisions;
  for (auto& [k, v] : kv) {
    if (k.rfind("running", 0) == 0) cores.push_back(v);
    if (k.rfind("decision", 0) == 0) decisions.push_back(v);
  }
  ASSERT_EQ(cores.size(), 2u) << "two ranks' lines";
  EXPECT_EQ(cores[0], cores[1]);
  EXPECT_EQ(decisions[0], decisions[1]);
  if (!runtime::best_openblas_core(cpu_isa()).empty() && decisions[0] != "not OpenBLAS")
    EXPECT_EQ(decisions[0], "selected");
}
