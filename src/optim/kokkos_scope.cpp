// KokkosScope: initialises Kokkos unless something already did, finalizes only what it started.
#include "shardtrain/optim/kokkos_scope.h"

#include <Kokkos_Core.hpp>

namespace shardtrain::optim {

KokkosScope::KokkosScope() {
  if (!Kokkos::is_initialized()) {
    Kokkos::initialize();
    owns_runtime_ = true;
  }
}

KokkosScope::~KokkosScope() {
  if (owns_runtime_ && Kokkos::is_initialized()) Kokkos::finalize();
}

bool kokkos_running() { return Kokkos::is_initialized(); }

}  // namespace shardtrain::optim
