// Comm argument validation and error forwarding: clear messages at issue or at wait().
#include <gtest/gtest.h>

#include <functional>

#include "comm_test_util.h"
#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/strategy_comms.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;
using namespace shardtrain::comm;
using namespace shardtrain::comm::testing;

namespace {
CommOptions test_options() {
  CommOptions o;
  o.timeout_s = 60;  // a bug that hangs becomes a watchdog report well before ctest's limit
  return o;
}

// Expects fn to throw shardtrain::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error containing '" << parts.front() << "'";
  } catch (const Error& e) {
    for (auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
        << "message '" << e.what() << "' lacks '" << p << "'";
  }
}
}  // namespace

TEST(CommErrors, BadArgumentsThrowAtIssueNamingGroupAndOp) {
  auto comm = make_mpi_comm(MPI_COMM_WORLD, "grp", test_options());
  const int n = comm->size(), r = comm->rank();
  at::Tensor f = at::zeros({4}, at::kFloat);
  expect_error([&] { comm->all_gather(at::zeros({4 * n + 1}, at::kFloat), f); },
               {"comm 'grp' all_gather", "out.numel() (" + std::to_string(4 * n + 1) + ")"});
  expect_error([&] { comm->all_gather(at::zeros({4 * n}, at::kDouble), f); },
               {"all_gather", "same dtype", "float64"});
  expect_error([&] { comm->reduce_scatter(f, at::zeros({4 * n + 2}, at::kFloat), ReduceOp::Sum); },
               {"reduce_scatter(sum)", "in.numel()"});
  expect_error([&] { comm->reduce_scatter(at::zeros({2}, at::kLong), at::zeros({2 * n}, at::kLong), ReduceOp::Sum); },
               {"reduce_scatter", "unsupported dtype int64"});
  at::Tensor strided = at::zeros({8, 2}, at::kFloat).t();
  expect_error([&] { comm->all_reduce(strided, ReduceOp::Sum); }, {"all_reduce(sum)", "contiguous"});
  expect_error([&] { comm->all_reduce(at::zeros({3}, at::kLong), ReduceOp::Avg); }, {"avg of int64"});
  expect_error([&] { comm->all_reduce(at::zeros({3}, at::kInt), ReduceOp::Sum); }, {"unsupported dtype int32"});
  expect_error([&] { comm->broadcast(f, n); }, {"broadcast", "root " + std::to_string(n)});
  expect_error([&] { comm->all_reduce(at::Tensor(), ReduceOp::Max); }, {"undefined"});
  // In place must use this rank's own slice.
  at::Tensor out = at::zeros({4 * n}, at::kFloat);
  if (n > 1) {
    at::Tensor wrong = out.narrow(0, ((r + 1) % n) * 4, 4);
    expect_error([&] { comm->all_gather(out, wrong); }, {"all_gather", "in place"});
  }
  at::Tensor base = at::zeros({4 * n + 1}, at::kFloat);
  expect_error([&] { comm->all_gather(base.narrow(0, 0, 4 * n), base.narrow(0, 1, 4)); },
               {"overlaps"});
  // Nothing was issued by the failed calls: the group is still in step.
  WorkPtr w = comm->barrier();
  w->wait();
  EXPECT_EQ(w->seq(), 1u);
}

TEST(CommErrors, RuntimeFailureIsRethrownAtWait) {
  // Two ranks disagree on the broadcast length: the receiver's MPI_Bcast fails with a
  // truncation error on the worker thread, which wait() must rethrow, naming the call.
  // Only a pair: in a larger tree the failed receiver would not forward to its children.
  const int n = world_size(), r = world_rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  MPI_Comm pair = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, r < 2 ? 0 : MPI_UNDEFINED, r, &pair);
  if (r < 2) {
    auto comm = make_mpi_comm(pair, "trunc", test_options());
    at::Tensor t = at::zeros({r == 0 ? 64 : 16}, at::kFloat);
    WorkPtr w = comm->broadcast(t, 0);
    if (r == 0) {
      w->wait();
    } else {
      expect_error([&] { w->wait(); }, {"MPI_Bcast", "failed"});
      expect_error([&] { w->wait(); }, {"MPI_Bcast"});  // every wait() reports it
      EXPECT_TRUE(w->is_completed());
    }
    comm.reset();
    MPI_Comm_free(&pair);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(CommErrors, UnknownOrUnavailableBackend) {
  fsdp::GroupOptions go;
  go.backend = "gloo";
  EXPECT_THROW(fsdp::open_groups(MPI_COMM_WORLD, go), UserError);
  // On the CPU (run.device = cpu): asking for NCCL is a clear error on every rank, not a hang.
  go.backend = "nccl";
  expect_error([&] { fsdp::open_groups(MPI_COMM_WORLD, go); }, {"nccl"});
}
