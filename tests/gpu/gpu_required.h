// When a `gpu` test that cannot run may skip (exit 77) and when it must fail instead (exit 1).
// On a machine with a GPU, "cannot run" means something is broken (a CPU libtorch, a build
// without NCCL, a CUDA runtime that finds no device): reporting it as skipped would let
// `ctest -L gpu` pass with nothing run. Only "fewer GPUs than ranks" is a legitimate skip there,
// and not even that under SHARDTRAIN_GPU_REQUIRED=1, which scripts/gpu-check sets (it leaves
// the 2-rank tests out by name on a one-GPU machine and says so).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace shardtrain::gputest {

// A GPU is present: the NVIDIA driver's device nodes exist. Deliberately not asked through CUDA
// or libtorch, whose failure is what must not pass for a skip.
inline bool gpu_present() { return access("/dev/nvidia0", F_OK) == 0 || access("/dev/nvidiactl", F_OK) == 0; }

inline bool gpu_required() {
  const char* e = std::getenv("SHARDTRAIN_GPU_REQUIRED");
  return e != nullptr && std::strcmp(e, "1") == 0;
}

// Why a test cannot run here; too_few_gpus marks the one reason that is no fault on a GPU machine.
struct CannotRun {
  std::string why;  // empty: the test can run
  bool too_few_gpus = false;
};

// True when a test that cannot run for `c` must fail rather than skip.
inline bool must_fail(const CannotRun& c) { return gpu_required() || (gpu_present() && !c.too_few_gpus); }

// Prints the verdict (on the calling rank) and returns the exit code: 77 (skipped) or 1 (failed).
inline int cannot_run_exit(const CannotRun& c, bool fail, bool print) {
  if (print) {
    if (fail)
      std::printf("FAIL: %s, and %s, so this is a failure, not a skip\n", c.why.c_str(),
                  gpu_required() ? "SHARDTRAIN_GPU_REQUIRED=1" : "this machine has a GPU (/dev/nvidia*)");
    else
      std::printf("SKIP: %s\n", c.why.c_str());
    std::fflush(stdout);
  }
  return fail ? 1 : 77;
}

}  // namespace shardtrain::gputest
