// gpu_engine: the FSDP engine on a CUDA device (one GPU per rank, NCCL when more than one rank):
// parameters after a few steps match the same engine on the CPU; CPU offload on CUDA equals the
// device-resident run bit for bit (the CUDA AdamW kernel equals the host Kokkos one; no clipping,
// so no reduction order enters); storages are freed between steps through the caching allocator;
// memory comes from the allocator's statistics and offload lowers the device peak; bf16 trains.
// Skipped (exit 77) without a CUDA libtorch or enough GPUs.
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <ATen/CPUGeneratorImpl.h>

#include <memory>
#include <string>

#include "../mpi/tiny_transformer.h"
#include "shardtrain/comm/comm.h"
#include "gpu_required.h"
#include "shardtrain/fsdp/device.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/model/layers.h"
#include "shardtrain/optim/adamw_cuda.h"
#include "shardtrain/optim/kokkos_scope.h"

using namespace shardtrain;

shardtrain::gputest::CannotRun gpu_test_skip_reason(int world) {
  if (!fsdp::torch_built_with_cuda()) return {"libtorch without CUDA"};
  if (fsdp::cuda_device_count() < world)
    // Too few GPUs is no fault only where torch sees some: none with a GPU present is a fault.
    return {"needs " + std::to_string(world) + " GPUs, " + std::to_string(fsdp::cuda_device_count()) + " visible",
            fsdp::cuda_device_count() > 0};
#ifndef SHARDTRAIN_HAVE_NCCL
  if (world > 1) return {"more than one rank needs NCCL"};
#endif
  return {};
}

namespace {

int world_rank() { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
int world_size() { int n; MPI_Comm_size(MPI_COMM_WORLD, &n); return n; }

struct EngineRun {
  std::unique_ptr<comm::Comm> shard;
  std::unique_ptr<tiny::Model> model;
  std::unique_ptr<fsdp::Engine> engine;
  std::unique_ptr<fsdp::ShardedOptimizer> opt;
  c10::Device device = c10::kCPU;
};

EngineRun make_run(c10::Device device, bool offload, at::ScalarType dtype, int limit_all_gathers = 2) {
  EngineRun run;
  run.device = device;
  comm::CommOptions o;
  o.timeout_s = 120;
  if (world_size() > 1)
    run.shard = device.is_cuda() ? comm::make_nccl_comm(MPI_COMM_WORLD, "shard", device.index(), o)
                                 : comm::make_mpi_comm(MPI_COMM_WORLD, "shard", o);
  tiny::Config c;
  run.model = std::make_unique<tiny::Model>(c, at::kMeta);
  fsdp::EngineOptions eo;
  eo.wrap_types = {run.model->blocks[0]->name()};
  eo.mp.param_dtype = dtype;
  eo.mp.keep_fp32 = {"ln_"};
  eo.forward_prefetch = true;
  eo.limit_all_gathers = limit_all_gathers;
  eo.device = device;
  eo.cpu_offload = offload;
  fsdp::EngineComms ec;
  ec.shard = run.shard.get();
  run.engine = std::make_unique<fsdp::Engine>(*run.model, ec, eo, tiny::init_param);
  fsdp::OptimizerConfig oc;
  oc.adamw.beta2 = 0.95f;
  oc.adamw.eps = 1e-6f;
  oc.adamw.weight_decay = 0.1f;
  oc.no_decay = {"bias", "ln_"};
  run.opt = std::make_unique<fsdp::ShardedOptimizer>(*run.engine, oc);
  return run;
}

at::Tensor batch(const tiny::Config& c, int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + step);
  return at::randint(c.vocab, {2 * world_size(), c.seq + 1}, gen, at::kLong).narrow(0, 2 * world_rank(), 2);
}

double train_step(EngineRun& run, int step, double clip) {
  tiny::Config c;
  at::Tensor b = batch(c, step).to(run.device);
  run.engine->zero_grad();
  run.engine->set_last_micro_batch(true);
  at::Tensor loss = run.model->loss(b.narrow(1, 0, c.seq), b.narrow(1, 1, c.seq));
  loss.backward();
  if (clip > 0) run.engine->clip_grad_norm(clip);
  run.opt->step(1e-2f);
  return loss.item<double>();
}

c10::Device gpu() { return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world_rank() % fsdp::cuda_device_count())); }

TEST(GpuEngine, CudaMatchesCpuEngine) {
  optim::KokkosScope kokkos;
  c10::cuda::CUDAGuard g(gpu().index());
  EngineRun cpu = make_run(c10::kCPU, false, at::kFloat), dev = make_run(gpu(), false, at::kFloat);
  for (int step = 0; step < 4; ++step) {
    double lc = train_step(cpu, step, 0.5), ld = train_step(dev, step, 0.5);
    EXPECT_NEAR(lc, ld, 1e-4 * std::abs(lc)) << "step " << step;
  }
  auto fc = cpu.engine->flat_params(), fd = dev.engine->flat_params();
  ASSERT_EQ(fc.size(), fd.size());
  for (size_t i = 0; i < fc.size(); ++i) {
    EXPECT_TRUE(fd[i]->master().is_cuda());
    EXPECT_TRUE(at::allclose(fd[i]->master().cpu(), fc[i]->master(), 1e-4, 1e-5)) << "flat " << i;
  }
  for (int i = 0; i < dev.engine->num_units(); ++i) {
    if (world_size() > 1) {
      EXPECT_EQ(dev.engine->unit_live_bytes(i), 0) << i;
    }
  }
}

TEST(GpuEngine, OffloadEqualsDeviceResidentRunBitForBit) {
  optim::KokkosScope kokkos;
  c10::cuda::CUDAGuard g(gpu().index());
  EngineRun dev = make_run(gpu(), false, at::kFloat), off = make_run(gpu(), true, at::kFloat);
  for (fsdp::FlatParam* fp : off.engine->flat_params()) {
    EXPECT_TRUE(fp->master().device().is_cpu());
    EXPECT_TRUE(fp->master().is_pinned());
    EXPECT_TRUE(fp->full().is_cuda());
  }
  for (int step = 0; step < 4; ++step) {
    double a = train_step(dev, step, 0), b = train_step(off, step, 0);
    EXPECT_EQ(a, b) << "step " << step;
  }
  auto fd = dev.engine->flat_params(), fo = off.engine->flat_params();
  for (size_t i = 0; i < fd.size(); ++i) {
    if (optim::adamw_cuda_built()) {
      EXPECT_TRUE(at::equal(fd[i]->master().cpu(), fo[i]->master())) << "flat " << i;
    } else {  // libtorch-op fallback on the device: a rounding apart
      EXPECT_TRUE(at::allclose(fd[i]->master().cpu(), fo[i]->master(), 1e-5, 1e-6)) << "flat " << i;
    }
  }
}

TEST(GpuEngine, MemoryFromTheAllocatorAndOffloadLowersThePeak) {
  optim::KokkosScope kokkos;
  c10::cuda::CUDAGuard g(gpu().index());
  int64_t peaks[2] = {0, 0};
  for (int offload = 0; offload < 2; ++offload) {
    fsdp::synchronize_device(gpu());
    EngineRun run = make_run(gpu(), offload != 0, at::kBFloat16, /*limit_all_gathers=*/1);
    run.engine->reset_peaks();
    double first = 0, last = 0;
    for (int step = 0; step < 6; ++step) {
      last = train_step(run, 0, 1.0);  // one batch: the loss must fall
      if (step == 0) first = last;
    }
    fsdp::MemoryStats m = run.engine->memory();
    EXPECT_GT(m.device_allocated_bytes, 0);
    EXPECT_GE(m.device_peak_allocated_bytes, m.device_allocated_bytes);
    EXPECT_LE(m.max_all_gathers_in_flight, 1);
    EXPECT_LT(last, first - 0.05) << "bf16 on CUDA should train (offload " << offload << ")";
    peaks[offload] = m.device_peak_allocated_bytes;
  }
  // Masters, gradient shards and moments (16 bytes per parameter) left the device.
  EXPECT_LT(peaks[1], peaks[0]);
}

// Rows packed apart (data.packing = "packed") on CUDA: the fused kernel with a block-diagonal
// causal mask (model::row_attention) equals each row's own explicit attention on the CPU.
TEST(GpuAttention, RowAttentionMatchesTheCpu) {
  at::manual_seed(3);
  const int64_t B = 2, H = 4, T = 16, hd = 8;
  const at::Tensor q = at::randn({B, H, T, hd}), k = at::randn({B, H, T, hd}), v = at::randn({B, H, T, hd});
  model::Rows rows;
  rows.cu_seqlens = {0, 5, 14, 16, 19, 26, 32};  // window 0: rows 5, 9 and padding 2; window 1: 3, 7, 6
  const at::Tensor cpu = model::row_attention(q, k, v, rows, 0.0, false);
  const at::Tensor gpu = model::row_attention(q.cuda(), k.cuda(), v.cuda(), rows, 0.0, false).cpu();
  EXPECT_TRUE(at::allclose(cpu, gpu, 1e-4, 1e-4)) << (cpu - gpu).abs().max().item<float>();
}

}  // namespace
