// The device path's state handling, run on the host: the optimizer's tensor implementation
// (what steps shards in GPU memory) against the Kokkos kernels, and checkpoints written from /
// read into tensor state through host staging buffers (what a CUDA run's save and load do).
#include <gtest/gtest.h>

#include <cmath>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "test_ckpt_util.h"

using namespace shardtrain;
using namespace ckpt_test;

namespace {

Layout with(std::string optimizer, bool tensors, fsdp::Strategy s = fsdp::Strategy::FullShard) {
  Layout L{"layout", s, 1};
  L.optimizer = std::move(optimizer);
  L.state_as_tensors = tensors;
  return L;
}

// Deterministic gradients for step `step`, the same for every layout (by parameter element).
void set_grads(Trainee& t, int step) {
  for (fsdp::FlatParam* fp : t.engine->flat_params()) {
    const int64_t sb = static_cast<int64_t>(fp->shard_rank()) * fp->shard_numel();
    float* g = fp->grad_shard().data_ptr<float>();
    fp->grad_shard().zero_();
    for (const auto& s : fp->slots())
      for (int64_t e = std::max(sb, s.offset); e < std::min(sb + fp->shard_numel(), s.offset + s.numel); ++e)
        g[e - sb] = 0.01f * value(s.name, e - s.offset, 7, static_cast<uint32_t>(step));
  }
}

// Largest |a - b| / (|b| + 1e-6) over every master and state element of two trainees.
double max_rel_diff(Trainee& a, Trainee& b) {
  std::vector<float> va, vb;
  for_each_element(a, [&](size_t, const fsdp::ParamSlot&, int64_t, float& x) { va.push_back(x); });
  for_each_element(b, [&](size_t, const fsdp::ParamSlot&, int64_t, float& x) { vb.push_back(x); });
  EXPECT_EQ(va.size(), vb.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(va.size(), vb.size()); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(va[i]) - vb[i]) / (std::fabs(vb[i]) + 1e-6));
  return worst;
}

}  // namespace

// Five steps with weight decay masks, AdamW and SGD with momentum: the tensor implementation
// follows the kernels' operation order, so it differs by roundings only (libtorch may fuse a
// multiply-add where the Kokkos kernel does not).
TEST(DeviceState, TensorOptimizerMatchesKokkos) {
  optim::KokkosScope kokkos;
  for (const char* name : {"adamw", "sgd"}) {
    Trainee host(MPI_COMM_WORLD, with(name, false)), dev(MPI_COMM_WORLD, with(name, true));
    ASSERT_FALSE(host.opt->state_in_tensors());
    ASSERT_TRUE(dev.opt->state_in_tensors());
    EXPECT_EQ(host.opt->state_names(), dev.opt->state_names());
    EXPECT_EQ(host.opt->state_bytes(), dev.opt->state_bytes());
    for (Trainee* t : {&host, &dev}) {
      fill(*t, 3);
      t->opt->set_steps_taken(0);
      // A second moment is never negative.
      for_each_element(*t, [&](size_t k, const fsdp::ParamSlot&, int64_t, float& x) {
        if (k == 2) x = std::fabs(x);
      });
    }
    for (int step = 1; step <= 5; ++step) {
      set_grads(host, step);
      set_grads(dev, step);
      host.opt->step(1e-2f);
      dev.opt->step(1e-2f);
    }
    EXPECT_EQ(dev.opt->steps_taken(), 5);
    EXPECT_LT(max_rel_diff(dev, host), 1e-5) << name;
    // The masters moved at all.
    EXPECT_GT(mismatches(dev, 3, /*master_only=*/true), 0) << name;
  }
}

// Tensor state -> file -> Kokkos state and back, direct and staged: bit for bit, any rank count.
TEST(DeviceState, CheckpointsMoveBetweenTensorAndKokkosState) {
  optim::KokkosScope kokkos;
  const std::string dir = test_dir("device_state");
  for (const char* name : {"adamw", "sgd"}) {
    for (bool from_tensors : {true, false}) {
      const std::string path = dir + "/" + name + (from_tensors ? "_tensors.h5" : "_kokkos.h5");
      {
        Trainee w(MPI_COMM_WORLD, with(name, from_tensors));
        fill(w, 5);
        ckpt::CheckpointInfo info;
        info.strategy = "full_shard";
        ckpt::TrainState st;
        st.step = 3;
        ckpt::save_checkpoint(path, *w.engine, *w.opt, st, info, MPI_COMM_WORLD);
        EXPECT_EQ(mismatches(w, 5), 0) << "saving must not change the shards";
      }
      for (bool staged : {false, true}) {
        // The other implementation reads it; the staged read into another sharding.
        {
          const fsdp::Strategy s = staged ? fsdp::Strategy::HybridShard : fsdp::Strategy::FullShard;
          Trainee r(MPI_COMM_WORLD, with(name, !from_tensors, s));
          ckpt::TrainState st;
          ckpt::LoadOptions lo;
          lo.staged = staged;
          ckpt::load_checkpoint(path, *r.engine, *r.opt, st, MPI_COMM_WORLD, lo);
          EXPECT_EQ(mismatches(r, 5), 0) << name << (from_tensors ? " tensors -> kokkos" : " kokkos -> tensors")
                                         << (staged ? " staged" : " direct");
          EXPECT_EQ(r.opt->steps_taken(), 17 + 5);
          EXPECT_EQ(st.step, 3);
        }
      }
    }
  }
}

// A staged load checks every digest before it copies anything: a file of another model
// leaves the shards as they were.
TEST(DeviceState, StagedLoadOfAnotherModelChangesNothing) {
  optim::KokkosScope kokkos;
  const std::string dir = test_dir("device_state_other");
  const std::string path = dir + "/other.h5";
  {
    Layout big = with("adamw", true);
    big.d = 32;
    Trainee w(MPI_COMM_WORLD, big);
    fill(w, 1);
    ckpt::CheckpointInfo info;
    ckpt::save_checkpoint(path, *w.engine, *w.opt, ckpt::TrainState{}, info, MPI_COMM_WORLD);
  }
  Trainee r(MPI_COMM_WORLD, with("adamw", true));
  fill(r, 2);
  ckpt::TrainState st;
  ckpt::LoadOptions lo;
  lo.staged = true;
  EXPECT_THROW(ckpt::load_checkpoint(path, *r.engine, *r.opt, st, MPI_COMM_WORLD, lo), UserError);
  EXPECT_EQ(mismatches(r, 2), 0);
}
