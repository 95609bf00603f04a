// gpu_nccl: the NCCL backend end to end on CUDA tensors (one GPU per rank): all-gather,
// reduce-scatter (avg, bf16), coalesced all-reduce of many small tensors in one group call,
// broadcast, barrier; ordering after torch's current stream without host synchronisation;
// buffers kept alive by the Comm until the done event (no recordStream); the watchdog polling
// CUDA events without firing. Skipped (exit 77) without NCCL, a CUDA libtorch or enough GPUs.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "../mpi/comm_test_util.h"
#include "shardtrain/comm/comm.h"
#include "shardtrain/comm/compute_stream.h"
#include "gpu_required.h"
#include "shardtrain/fsdp/device.h"

using namespace shardtrain;
using namespace shardtrain::comm;
using namespace shardtrain::comm::testing;

shardtrain::gputest::CannotRun gpu_test_skip_reason(int world) {
#ifndef SHARDTRAIN_HAVE_NCCL
  return {"built without NCCL"};
#else
  if (!fsdp::torch_built_with_cuda()) return {"libtorch without CUDA"};
  if (fsdp::cuda_device_count() < world)
    // Too few GPUs is no fault only where torch sees some: none with a GPU present is a fault.
    return {"needs " + std::to_string(world) + " GPUs, " + std::to_string(fsdp::cuda_device_count()) + " visible",
            fsdp::cuda_device_count() > 0};
  return {};
#endif
}

namespace {

int device() { return world_rank() % fsdp::cuda_device_count(); }
at::TensorOptions cuda(at::ScalarType t) { return at::TensorOptions().dtype(t).device(at::kCUDA, device()); }

struct NcclFixture : ::testing::Test {
  std::unique_ptr<Comm> comm;
  std::unique_ptr<c10::cuda::CUDAGuard> guard;
  std::unique_ptr<ComputeStreamGuard> stream;
  void SetUp() override {
    guard = std::make_unique<c10::cuda::CUDAGuard>(device());
    // A non-default compute stream, as the engine would have: ordering must follow it.
    c10::cuda::setCurrentCUDAStream(c10::cuda::getStreamFromPool(false, device()));
    stream = std::make_unique<ComputeStreamGuard>(c10::cuda::getCurrentCUDAStream(device()).stream());
    CommOptions o;
    o.timeout_s = 60;
    comm = make_nccl_comm(MPI_COMM_WORLD, "world", device(), o);
  }
  void TearDown() override {
    comm.reset();
    stream.reset();
    c10::cuda::setCurrentCUDAStream(c10::cuda::getDefaultCUDAStream(device()));
    guard.reset();
  }
};

TEST_F(NcclFixture, AllGatherInPlaceAndOutOfPlaceEveryDtype) {
  const int n = world_size(), r = world_rank();
  for (at::ScalarType dt : float_dtypes())
    for (int64_t numel : {int64_t{1}, int64_t{1001}, int64_t{(1 << 20) + 3}}) {
      // Written by a kernel on the compute stream just before issue: no host synchronisation.
      at::Tensor out = at::empty({n * numel}, cuda(dt));
      at::Tensor mine = out.narrow(0, r * numel, numel);
      mine.copy_(rank_values(r, numel, dt).to(out.device()), /*non_blocking=*/true);
      comm->all_gather(out, mine)->wait();
      for (int q = 0; q < n; ++q)
        ASSERT_TRUE(at::equal(out.narrow(0, q * numel, numel).cpu(), rank_values(q, numel, dt)))
            << c10::toString(dt) << " numel " << numel << " chunk " << q;
      at::Tensor out2 = at::empty({n * numel}, cuda(dt));
      comm->all_gather(out2, rank_values(r, numel, dt).to(out.device()))->wait();
      ASSERT_TRUE(at::equal(out2.cpu(), out.cpu()));
    }
}

TEST_F(NcclFixture, ReduceScatterAvgFp32AndBf16) {
  const int n = world_size(), r = world_rank();
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const int64_t chunk = 4099;
    at::Tensor in = rank_values(r, n * chunk, dt).to(cuda(dt).device());
    at::Tensor out = at::empty({chunk}, cuda(dt));
    comm->reduce_scatter(out, in, ReduceOp::Avg)->wait();
    at::Tensor want = at::zeros({n * chunk}, at::kDouble);
    for (int q = 0; q < n; ++q) want += rank_values(q, n * chunk, at::kDouble);
    want = (want / n).narrow(0, r * chunk, chunk);
    EXPECT_TRUE(at::allclose(out.cpu().to(at::kDouble), want, 0, dt == at::kFloat ? 1e-6 : 2e-2)) << c10::toString(dt);
  }
}

TEST_F(NcclFixture, CoalescedAllReduceOfManySmallTensorsIsOneGroupCall) {
  const int n = world_size(), r = world_rank();
  std::vector<at::Tensor> ts;
  for (int i = 0; i < 200; ++i) ts.push_back(rank_values(r + i, 1 + i % 13, at::kFloat).to(cuda(at::kFloat).device()));
  auto before = comm->flight_records().size();
  auto w = comm->all_reduce_coalesced(ts, ReduceOp::Sum);
  w->wait();
  auto recs = comm->flight_records();
  ASSERT_EQ(recs.size(), std::min<size_t>(before + 1, 64));  // one record: one collective
  EXPECT_EQ(recs.back().op, "all_reduce_coalesced(sum)");
  for (int i = 0; i < 200; ++i) {
    at::Tensor want = at::zeros({1 + i % 13}, at::kFloat);
    for (int q = 0; q < n; ++q) want += rank_values(q + i, 1 + i % 13, at::kFloat);
    ASSERT_TRUE(at::equal(ts[i].cpu(), want)) << i;
  }
}

TEST_F(NcclFixture, BroadcastAndBarrier) {
  const int r = world_rank();
  at::Tensor t = rank_values(r, 333, at::kLong).to(cuda(at::kLong).device());
  comm->broadcast(t, 0)->wait();
  EXPECT_TRUE(at::equal(t.cpu(), rank_values(0, 333, at::kLong)));
  auto b = comm->barrier();
  b->wait();
  EXPECT_TRUE(b->is_completed());
}

// The Comm holds a collective's tensors until its done event completes: dropping every
// reference (and the Work) right after issue must not let the caching allocator hand that
// memory to a new tensor while the collective may still write it. If it did, the all-gather
// (queued on its own stream) could overwrite the new tensor after the fill below.
TEST_F(NcclFixture, DroppedTensorsStayAliveUntilTheCollectiveCompletes) {
  const int n = world_size(), r = world_rank();
  const int64_t numel = 1 << 24;
  for (int round = 0; round < 5; ++round) {
    {
      at::Tensor out = at::empty({n * numel}, cuda(at::kFloat));
      comm->all_gather(out, rank_values(r, numel, at::kFloat).to(out.device()));
    }
    at::Tensor fresh = at::empty({n * numel}, cuda(at::kFloat));  // same size: reuse if returned
    fresh.fill_(7.0f);
    comm->barrier()->wait();
    c10::cuda::getCurrentCUDAStream(device()).synchronize();
    EXPECT_EQ(fresh.eq(7.0f).all().item<bool>(), true) << "round " << round;
  }
}

TEST_F(NcclFixture, WatchdogPollsEventsWithoutFiring) {
  at::Tensor t = at::ones({1 << 20}, cuda(at::kFloat));
  for (int i = 0; i < 200; ++i) comm->all_reduce(t, ReduceOp::Max);
  comm->barrier()->wait();
  EXPECT_TRUE(at::equal(t.cpu(), at::ones({1 << 20}, at::kFloat)));
}

}  // namespace
