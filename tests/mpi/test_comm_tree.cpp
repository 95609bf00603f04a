// Fixed-tree collectives (reduce_scatter_tree, all_reduce_tree): their results equal, bit for
// bit, a pairwise tree sum each rank computes locally, in every float dtype and on both
// all-reduce paths; a tree of leaves split over any power-of-two group (each rank summing its
// own leaves' subtree first) gives the same bits as one rank summing all the leaves; groups
// that are not a power of two are refused.
#include <gtest/gtest.h>

#include "comm_test_util.h"
#include "shardtrain/comm/comm.h"

using namespace shardtrain;
using namespace shardtrain::comm;
using namespace shardtrain::comm::testing;

namespace {

// Values whose sums round (unlike comm_test_util's small integers): a different association
// would show in the low bits.
at::Tensor leaf_values(int leaf, int64_t numel, at::ScalarType dtype) {
  at::Generator g = at::detail::createCPUGenerator(1000 + leaf);
  return at::randn({numel}, g, at::TensorOptions().dtype(at::kFloat)).mul_(1 + leaf % 3).to(dtype);
}

// Sum of leaves [first, first + count) in the pairwise tree, in the accumulation type (fp32 for
// halves, as the backend), rounded to `dtype` once.
at::Tensor tree_sum(int first, int count, int64_t numel, at::ScalarType dtype) {
  const at::ScalarType acc = dtype == at::kDouble ? at::kDouble : at::kFloat;
  std::vector<at::Tensor> level;
  for (int i = 0; i < count; ++i) level.push_back(leaf_values(first + i, numel, dtype).to(acc));
  while (level.size() > 1) {
    std::vector<at::Tensor> up;
    for (size_t i = 0; i < level.size(); i += 2) up.push_back(level[i] + level[i + 1]);
    level = std::move(up);
  }
  return level[0].to(dtype);
}

bool power_of_two(int n) { return (n & (n - 1)) == 0; }

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() != b.numel() || a.scalar_type() != b.scalar_type()) return false;
  return std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

}  // namespace

TEST(CommTree, ReduceScatterEqualsLocalTreeEveryDtype) {
  if (!power_of_two(world_size())) GTEST_SKIP() << "a group of 3 is refused (next test)";
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  for (at::ScalarType dt : float_dtypes()) {
    for (int64_t chunk : {int64_t(0), int64_t(1), int64_t(1001), int64_t(70001)}) {
      SCOPED_TRACE(dtype_str(dt) + " chunk " + std::to_string(chunk));
      at::Tensor in = leaf_values(r, n * chunk, dt);
      at::Tensor out = at::full({chunk}, 7, dt);
      comm->reduce_scatter_tree(out, in)->wait();
      EXPECT_TRUE(same_bits(out, tree_sum(0, n, n * chunk, dt).narrow(0, r * chunk, chunk)));
    }
  }
}

TEST(CommTree, AllReduceEqualsLocalTreeOnBothPaths) {
  if (!power_of_two(world_size())) GTEST_SKIP() << "a group of 3 is refused (next test)";
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  for (at::ScalarType dt : float_dtypes()) {
    // 4096 n: reduce-scatter + all-gather; 4096 n + 1 and 5: recursive doubling.
    for (int64_t numel : {int64_t(5), int64_t(4096) * n, int64_t(4096) * n + 1}) {
      SCOPED_TRACE(dtype_str(dt) + " numel " + std::to_string(numel));
      at::Tensor t = leaf_values(r, numel, dt);
      comm->all_reduce_tree(t)->wait();
      EXPECT_TRUE(same_bits(t, tree_sum(0, n, numel, dt)));
    }
  }
}

// What train.reproducible relies on: 8 leaves, each rank summing its 8/n consecutive leaves
// as a subtree and then the group's tree over ranks: the same bits at every n.
TEST(CommTree, LeavesSplitOverAnyGroupGiveOneRanksBits) {
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  if (8 % n != 0) GTEST_SKIP() << "8 leaves need a group size dividing 8";
  const int64_t chunk = 3001, numel = n * chunk;
  const at::Tensor local = tree_sum(r * (8 / n), 8 / n, numel, at::kFloat);
  at::Tensor out = at::empty({chunk}, at::kFloat);
  comm->reduce_scatter_tree(out, local)->wait();
  EXPECT_TRUE(same_bits(out, tree_sum(0, 8, numel, at::kFloat).narrow(0, r * chunk, chunk)));
  at::Tensor all = local.clone();
  comm->all_reduce_tree(all)->wait();
  EXPECT_TRUE(same_bits(all, tree_sum(0, 8, numel, at::kFloat)));
}

TEST(CommTree, RefusesGroupsThatAreNotPowersOfTwo) {
  if (world_size() < 3) GTEST_SKIP() << "needs 3 ranks for a group of 3";
  MPI_Comm three;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < 3 ? 0 : 1, world_rank(), &three);
  if (world_rank() < 3) {
    CommOptions o;
    auto comm = make_mpi_comm(three, "three", o);
    at::Tensor in = at::zeros({9}), out = at::zeros({3});
    try {
      comm->reduce_scatter_tree(out, in);
      FAIL() << "a group of 3 was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("power-of-two group, this one has 3 ranks"), std::string::npos) << e.what();
    }
    EXPECT_THROW(comm->all_reduce_tree(out), std::exception);
  }
  MPI_Comm_free(&three);
}
