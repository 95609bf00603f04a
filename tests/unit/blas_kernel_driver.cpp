// blas_kernel_driver: runs runtime::select_blas_kernel() like main() does (it may re-exec) and
// prints the result as key=value lines, for test_blas_kernel.
#include <signal.h>
#include <unistd.h>

#include <cstdio>

#include "shardtrain/runtime/blas_kernel.h"

extern "C" char* openblas_get_corename() __attribute__((weak));

int main(int, char** argv) {
  shardtrain::runtime::select_blas_kernel(argv);
  const auto& k = shardtrain::runtime::blas_kernel();
  sigset_t cur;
  sigprocmask(SIG_BLOCK, nullptr, &cur);
  std::printf("pid=%d\ndecision=%s\ncore=%s\nautodetected=%s\nlibrary=%s\nreason=%s\n", getpid(), k.decision.c_str(),
              k.core.c_str(), k.autodetected.c_str(), k.library.c_str(), k.reason.c_str());
  std::printf("running=%s\n", openblas_get_corename ? openblas_get_corename() : "");
  std::printf("gflops=%.3f\nfallback_gflops=%.3f\nchecked=%d\naccurate=%d\n", k.gflops, k.fallback_gflops, k.checked,
              k.accurate);
  std::printf("sigterm_blocked=%d\nline=%s\n", sigismember(&cur, SIGTERM), k.line().c_str());
  return 0;
}
