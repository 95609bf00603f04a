// MPI backend collectives: every op x dtype x size (padded like FSDP), in place and out of
// place, checked against references each rank computes locally. The full cross product runs
// at the small sizes; the large size (several ring segments, MPI's large-message paths) runs
// with fewer combinations where op, dtype and aliasing act element by element (see each test).
#include <gtest/gtest.h>

#include <cmath>

#include "comm_test_util.h"
#include "shardtrain/comm/comm.h"

using namespace shardtrain;
using namespace shardtrain::comm;
using namespace shardtrain::comm::testing;

namespace {

// The small sizes, then the large one.
std::vector<int64_t> all_sizes() {
  std::vector<int64_t> v = small_sizes();
  v.push_back(kLargeOdd);
  return v;
}

// padded_values of every rank, as double: the inputs of the references.
std::vector<at::Tensor> rank_inputs(int n, int64_t numel, int64_t total, at::ScalarType dtype) {
  std::vector<at::Tensor> v;
  for (int q = 0; q < n; ++q) v.push_back(padded_values(q, numel, total, dtype).to(at::kDouble));
  return v;
}

// Sum (or max, or average) over ranks of rank_inputs, as double.
at::Tensor reference_reduce(const std::vector<at::Tensor>& inputs, ReduceOp op) {
  at::Tensor acc = inputs[0].clone();
  for (size_t q = 1; q < inputs.size(); ++q)
    acc = op == ReduceOp::Max ? at::maximum(acc, inputs[q]) : acc + inputs[q];
  if (op == ReduceOp::Avg) acc = acc / static_cast<double>(inputs.size());
  return acc;
}

}  // namespace

TEST(CommMpi, AllGatherEveryDtypeSizeInPlaceAndOut) {
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  ASSERT_EQ(n, world_size());
  ASSERT_EQ(r, world_rank());
  std::vector<at::ScalarType> dtypes = float_dtypes();
  dtypes.push_back(at::kLong);
  for (at::ScalarType dt : dtypes) {
    for (int64_t numel : all_sizes()) {
      const int64_t total = padded(numel, n), shard = total / n;
      // Every rank contributes its slice of the same logical flat tensor, as in FSDP.
      at::Tensor full = padded_values(7, numel, total, dt);
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(dtype_str(dt) + " numel " + std::to_string(numel) + (in_place ? " in place" : ""));
        at::Tensor out = at::full({total}, 99, dt);
        at::Tensor in;
        if (in_place) {
          in = out.narrow(0, r * shard, shard);
          in.copy_(full.narrow(0, r * shard, shard));
        } else {
          in = full.narrow(0, r * shard, shard).clone();
        }
        WorkPtr w = comm->all_gather(out, in);
        w->wait();
        EXPECT_TRUE(w->is_completed());
        EXPECT_TRUE(same_values(out, full));
      }
    }
  }
}

// Small sizes: every dtype x op x in place / out of place. Large size (the ring's segment
// loop, one instantiation per dtype): every dtype x op, in place for Avg only, out of place for
// Sum and Max. The op and the aliasing of out with this rank's input act element by element
// inside each segment, so the small sizes check every op in place at every dtype.
TEST(CommMpi, ReduceScatterSumAvgMaxEveryDtypeSize) {
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  for (at::ScalarType dt : float_dtypes()) {
    for (int64_t numel : all_sizes()) {
      const int64_t total = padded(numel, n), shard = total / n;
      const std::vector<at::Tensor> inputs = rank_inputs(n, numel, total, dt);
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        at::Tensor ref = reference_reduce(inputs, op).narrow(0, r * shard, shard);
        for (bool in_place : {false, true}) {
          if (numel == kLargeOdd && in_place != (op == ReduceOp::Avg)) continue;
          SCOPED_TRACE(dtype_str(dt) + " numel " + std::to_string(numel) + " " + to_string(op) +
                       (in_place ? " in place" : ""));
          at::Tensor in = padded_values(r, numel, total, dt);
          at::Tensor out = in_place ? in.narrow(0, r * shard, shard) : at::full({shard}, 99, dt);
          comm->reduce_scatter(out, in, op)->wait();
          if (op == ReduceOp::Avg) EXPECT_TRUE(close_values(out, ref.to(dt), dt));
          else EXPECT_TRUE(same_values(out, ref));
        }
      }
    }
  }
}

// In place into another rank's slice (the validator allows any rank's slice): at 2 ranks the
// only step sends that very slice while its result is written, so the sends must finish first;
// a size of several ring segments. (Whether an unfinished send would read overwritten data
// depends on timing; this checks the path's result.)
TEST(CommMpi, ReduceScatterInPlaceIntoAnotherRanksSlice) {
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  if (n < 2) GTEST_SKIP() << "needs another rank";
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const int64_t numel = kLargeOdd, total = padded(numel, n), shard = total / n;
    const std::vector<at::Tensor> inputs = rank_inputs(n, numel, total, dt);
    at::Tensor ref = reference_reduce(inputs, ReduceOp::Sum).narrow(0, r * shard, shard);
    at::Tensor in = padded_values(r, numel, total, dt);
    at::Tensor out = in.narrow(0, ((r + 1) % n) * shard, shard);
    SCOPED_TRACE(dtype_str(dt));
    comm->reduce_scatter(out, in, ReduceOp::Sum)->wait();
    EXPECT_TRUE(same_values(out, ref));
  }
}

// Small sizes: every dtype x op. Large size: every op for fp32 (MPI's own reduction) and bf16
// (reduced in an fp32 copy, the path fp16 shares), Sum for fp64, fp16 and int64.
TEST(CommMpi, AllReduceSumAvgMaxEveryDtypeSize) {
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  std::vector<at::ScalarType> dtypes = float_dtypes();
  dtypes.push_back(at::kLong);
  for (at::ScalarType dt : dtypes) {
    for (int64_t numel : all_sizes()) {
      const std::vector<at::Tensor> inputs = rank_inputs(n, numel, numel, dt);
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        if (dt == at::kLong && op == ReduceOp::Avg) continue;
        if (numel == kLargeOdd && op != ReduceOp::Sum && dt != at::kFloat && dt != at::kBFloat16) continue;
        SCOPED_TRACE(dtype_str(dt) + " numel " + std::to_string(numel) + " " + to_string(op));
        at::Tensor ref = reference_reduce(inputs, op);
        at::Tensor t = padded_values(r, numel, numel, dt);
        comm->all_reduce(t, op)->wait();
        if (op == ReduceOp::Avg) EXPECT_TRUE(close_values(t, ref.to(dt), dt));
        else EXPECT_TRUE(same_values(t, ref));
      }
    }
  }
}

TEST(CommMpi, HalfPrecisionSumsAccumulateInFp32) {
  // 1 + n * 2^-9 is not representable in bf16 step by step (each 1 + 2^-9 rounds back to 1),
  // but the fp32 sum rounds once: with n=4 ranks it is 1 + 2^-7, exact in bf16.
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  if (n != 4) GTEST_SKIP() << "needs 4 ranks";
  at::Tensor t = at::full({3}, r == 0 ? 1.0 : std::ldexp(1.0, -9), at::kBFloat16);
  at::Tensor in = at::full({4 * 3}, r == 0 ? 1.0 : std::ldexp(1.0, -9), at::kBFloat16);
  at::Tensor out = at::empty({3}, at::kBFloat16);
  comm->all_reduce(t, ReduceOp::Sum)->wait();
  comm->reduce_scatter(out, in, ReduceOp::Sum)->wait();
  const double expect = 1.0 + 3 * std::ldexp(1.0, -9);  // rounds to 1 + 2^-7 in bf16
  EXPECT_DOUBLE_EQ(t[0].item<double>(), at::scalar_tensor(expect, at::kBFloat16).item<double>());
  EXPECT_DOUBLE_EQ(out[0].item<double>(), at::scalar_tensor(expect, at::kBFloat16).item<double>());
  EXPECT_GT(out[0].item<double>(), 1.0);
}

// Every dtype at the small sizes; the large size for fp32 and bf16 (a 4-byte and a 2-byte MPI
// type; the dtype only picks the MPI type). Every root each time.
TEST(CommMpi, BroadcastFromEveryRoot) {
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  std::vector<at::ScalarType> dtypes = float_dtypes();
  dtypes.push_back(at::kLong);
  for (at::ScalarType dt : dtypes)
    for (int64_t numel : {int64_t(0), int64_t(1), int64_t(1001), kLargeOdd})
      for (int root = 0; root < n; ++root) {
        if (numel == kLargeOdd && dt != at::kFloat && dt != at::kBFloat16) continue;
        SCOPED_TRACE(dtype_str(dt) + " numel " + std::to_string(numel) + " root " + std::to_string(root));
        at::Tensor t = rank_values(r, numel, dt);
        comm->broadcast(t, root)->wait();
        EXPECT_TRUE(same_values(t, rank_values(root, numel, dt)));
      }
}

TEST(CommMpi, ManyCollectivesInFlightRunInIssueOrder) {
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  // A chain of dependent collectives issued before any wait: reduce-scatter A into B, then
  // all-gather B back into A, ten times (with no-op broadcasts and barriers in between).
  // Only issue order yields A[j] = n^(k-1) * c_j, c_j = n*n(n-1)/2 + n(j+1).
  at::Tensor A = at::arange(n, at::kDouble) + (r * n + 1), B = at::empty({1}, at::kDouble);
  std::vector<WorkPtr> works;
  const int rounds = 10;
  for (int k = 0; k < rounds; ++k) {
    works.push_back(comm->reduce_scatter(B, A, ReduceOp::Sum));
    works.push_back(comm->all_gather(A, B));
    works.push_back(comm->broadcast(A, k % n));  // A is equal everywhere: no change
    works.push_back(comm->barrier());
  }
  for (size_t i = 1; i < works.size(); ++i) EXPECT_EQ(works[i]->seq(), works[i - 1]->seq() + 1);
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();  // any wait order
  for (auto& w : works) EXPECT_TRUE(w->is_completed());
  for (int j = 0; j < n; ++j) {
    double c = n * n * (n - 1) / 2.0 + n * (j + 1.0);
    EXPECT_EQ(A[j].item<double>(), std::pow(double(n), rounds - 1) * c) << "j " << j;
  }
}

TEST(CommMpi, SequenceNumbersAndFlightRecorder) {
  CommOptions o;
  o.flight_recorder_entries = 8;
  auto comm = make_mpi_comm(MPI_COMM_WORLD, "recorded", o);
  const int n = comm->size();
  at::Tensor t = at::ones({3}, at::kBFloat16);
  WorkPtr last;
  for (int k = 0; k < 19; ++k) last = comm->all_reduce(t, ReduceOp::Max);
  at::Tensor out = at::empty({4 * n}, at::kHalf), in = at::ones({4}, at::kHalf);
  last = comm->all_gather(out, in);
  last->wait();
  EXPECT_EQ(last->seq(), 20u);
  auto recs = comm->flight_records();
  ASSERT_EQ(recs.size(), 8u);
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i].seq, 13 + i);
    EXPECT_GT(recs[i].issued_s, 0);
    EXPECT_GE(recs[i].started_s, recs[i].issued_s);
    EXPECT_GE(recs[i].finished_s, recs[i].started_s);
  }
  EXPECT_EQ(recs[0].op, "all_reduce(max)");
  EXPECT_EQ(recs[0].numel, 3);
  EXPECT_EQ(recs[0].dtype, "bfloat16");
  EXPECT_EQ(recs.back().op, "all_gather");
  EXPECT_EQ(recs.back().numel, 4 * n);
  EXPECT_EQ(recs.back().dtype, "float16");
  // Disabled recorder: no records, collectives still work.
  o.flight_recorder_entries = 0;
  auto quiet = make_mpi_comm(MPI_COMM_WORLD, "quiet", o);
  quiet->barrier()->wait();
  EXPECT_TRUE(quiet->flight_records().empty());
}

TEST(CommMpi, DestroyingTheCommFinishesOutstandingWork) {
  const int n = world_size();
  at::Tensor t = at::ones({100000}, at::kDouble);
  WorkPtr w;
  {
    auto comm = world_comm();
    for (int k = 0; k < 5; ++k) w = comm->all_reduce(t, ReduceOp::Sum);
  }
  w->wait();
  EXPECT_EQ(t[99999].item<double>(), std::pow(double(n), 5));
}

// The default all_reduce_coalesced (MPI): one collective per tensor, in order, one Work.
TEST(CommMpi, CoalescedAllReduceEqualsOneByOne) {
  auto comm = world_comm();
  const int n = world_size(), r = world_rank();
  std::vector<at::Tensor> ts, want;
  for (int i = 0; i < 9; ++i) {
    ts.push_back(rank_values(r + i, 1 + 37 * i, at::kFloat));
    at::Tensor w = at::zeros({1 + 37 * i}, at::kFloat);
    for (int q = 0; q < n; ++q) w += rank_values(q + i, 1 + 37 * i, at::kFloat);
    want.push_back(w / n);
  }
  auto work = comm->all_reduce_coalesced(ts, ReduceOp::Avg);
  work->wait();
  EXPECT_TRUE(work->is_completed());
  EXPECT_EQ(work->seq(), 9u);
  for (int i = 0; i < 9; ++i) EXPECT_TRUE(at::allclose(ts[i], want[i])) << i;
  auto empty = comm->all_reduce_coalesced({}, ReduceOp::Sum);
  empty->wait();
  EXPECT_EQ(empty->seq(), 0u);
}
