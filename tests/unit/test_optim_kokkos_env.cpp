// The test binary's Kokkos runtime: one KokkosScope for the whole process, as main() holds one.
#include <gtest/gtest.h>

#include <memory>

#include "shardtrain/optim/kokkos_scope.h"

namespace {
// Kokkos cannot be initialised again after finalize, so tests must not each own a scope.
class KokkosEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { scope_ = std::make_unique<shardtrain::optim::KokkosScope>(); }
  void TearDown() override { scope_.reset(); }

 private:
  std::unique_ptr<shardtrain::optim::KokkosScope> scope_;
};

[[maybe_unused]] ::testing::Environment* const kokkos_env =
    ::testing::AddGlobalTestEnvironment(new KokkosEnvironment);
}  // namespace
