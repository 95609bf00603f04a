// KokkosScope: RAII ownership of the process-wide Kokkos runtime that the fused optimizers run on.
#pragma once

namespace shardtrain::optim {

// Kokkos may be initialised once per process and never again after finalize, so exactly one
// scope should own it: main() creates a KokkosScope before the first optimizer step and keeps
// it alive until the last one. A scope created while Kokkos is already running (by an outer
// scope, a test environment or a host application) does nothing, so libraries and tests may
// create their own without coordinating; only the scope that initialised Kokkos finalizes it.
class KokkosScope {
 public:
  KokkosScope();
  ~KokkosScope();
  KokkosScope(const KokkosScope&) = delete;
  KokkosScope& operator=(const KokkosScope&) = delete;

  // True when this scope initialised Kokkos and will finalize it.
  bool owns_runtime() const { return owns_runtime_; }

 private:
  bool owns_runtime_ = false;
};

// True while Kokkos is initialised (the kernels check it and name KokkosScope when it is not).
bool kokkos_running();

}  // namespace shardtrain::optim
