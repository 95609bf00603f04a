// FSDP engine memory bookkeeping on a small GPT-2: per-rank state bytes against 16Psi/N and the
// flat layout, peak unsharded bytes against the prefetch bound, resharding after a step, and the
// step-0 loss against a one-process CPU model with the same init.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/fsdp/strategy_comms.h"
#include "shardtrain/model/model.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/runtime/device_mesh.h"
#include "shardtrain/runtime/topology.h"

using namespace shardtrain;

namespace {

int world_rank() { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
int world_size() { int n; MPI_Comm_size(MPI_COMM_WORLD, &n); return n; }

// d_model 30 makes every flat length 2 mod 4, so np 4 pads each flat (np 2 pads none).
model::ModelSpec tiny_spec() {
  model::ModelSpec s;
  s.arch = "gpt2";
  s.vocab_size = 97;
  s.seq_len = 16;
  s.d_model = 30;
  s.n_layers = 3;
  s.n_heads = 3;
  return s;
}

constexpr uint64_t kSeed = 7;
constexpr int64_t kMicro = 2;  // sequences per rank

struct Config {
  std::string name;
  fsdp::Strategy strategy = fsdp::Strategy::FullShard;
  at::ScalarType dtype = at::kFloat;
  int limit_all_gathers = 2;
};

// A GPT-2 on meta, wrapped by the engine with the model's own init, wrap and fp32 rules.
struct Wrapped {
  fsdp::ShardedGroups groups;  // by the path production takes (fsdp::open_groups)
  std::shared_ptr<model::Model> model;
  std::unique_ptr<fsdp::Engine> engine;
  std::unique_ptr<fsdp::ShardedOptimizer> opt;
};

std::unique_ptr<Wrapped> wrap(const Config& k) {
  auto w = std::make_unique<Wrapped>();
  const int N = world_size();
  // Hybrid: hosts of N/2 ranks (np 4: 2 replicas of 2 shards), else the real single host.
  const int hosts_of = fsdp::is_hybrid(k.strategy) ? std::max(1, N / 2) : 0;
  fsdp::GroupOptions go;
  go.strategy = k.strategy;
  go.simulate_ranks_per_host = hosts_of;
  go.backend = "mpi";
  go.comm.timeout_s = 120;
  w->groups = fsdp::open_groups(MPI_COMM_WORLD, go);
  w->model = model::build_model(tiny_spec(), at::kMeta);
  fsdp::EngineOptions eo;
  eo.strategy = k.strategy;
  eo.wrap_types = w->model->block_types();
  eo.mp.param_dtype = k.dtype;
  eo.mp.keep_fp32 = w->model->norm_param_patterns();
  eo.limit_all_gathers = k.limit_all_gathers;
  model::Model* m = w->model.get();
  w->engine = std::make_unique<fsdp::Engine>(*m, w->groups.comms.engine(), eo, [m](const std::string& name, at::Tensor& t) {
    model::init_parameter(t, m->init_for(name), model::param_seed(kSeed, name));
  });
  fsdp::OptimizerConfig oc;
  oc.no_decay = m->no_decay_patterns();
  w->opt = std::make_unique<fsdp::ShardedOptimizer>(*w->engine, oc);
  return w;
}

// Global batch: G sequences of seq+1 tokens, the same on every rank.
at::Tensor global_batch(int64_t G) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  return at::randint(tiny_spec().vocab_size, {G, tiny_spec().seq_len + 1}, gen, at::kLong);
}

// One training step on this rank's slice; returns the global mean loss (mean of rank means).
double train_step(Wrapped& w, const at::Tensor& batch) {
  const int r = world_rank(), N = world_size();
  const int64_t T = tiny_spec().seq_len;
  at::Tensor mine = batch.narrow(0, r * kMicro, kMicro);
  w.engine->zero_grad();
  w.engine->set_last_micro_batch(true);
  at::Tensor loss = w.model->loss(mine.narrow(1, 0, T), mine.narrow(1, 1, T));
  loss.backward();
  w.engine->clip_grad_norm(1.0);
  w.opt->step(1e-3f);
  double l = loss.item<double>(), sum = 0;
  MPI_Allreduce(&l, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return sum / N;
}

// Unsharded bytes of each unit (its flats that do not alias their masters), from the layout
// the engine was built from.
std::vector<int64_t> unit_full_bytes(fsdp::Engine& e) {
  std::vector<int64_t> bytes;
  for (const fsdp::UnitPlan& u : e.layout()) {
    int64_t b = 0;
    for (const fsdp::FlatPlan& f : u.flats)
      if (!f.aliases_master) b += f.full_bytes();
    bytes.push_back(b);
  }
  return bytes;
}

class EngineMemory : public ::testing::TestWithParam<Config> {
 protected:
  optim::KokkosScope kokkos_;
  void SetUp() override { at::set_num_threads(std::max(1, 2 / world_size())); }
};

TEST_P(EngineMemory, StateBytesMatchTheFlatLayout) {
  const Config k = GetParam();
  auto w = wrap(k);
  fsdp::Engine& e = *w->engine;
  const int S = w->groups.comms.shard_size();
  const int64_t psi = model::parameter_count(model::resolve_spec(tiny_spec()));

  int64_t numel = 0, shard_elems = 0, padded = 0;
  for (fsdp::FlatParam* fp : e.flat_params()) {
    // The layout: padded to a multiple of S (at least S), this rank owns padded/S elements.
    EXPECT_EQ(fp->shard_size(), S);
    EXPECT_EQ(fp->padded(), std::max<int64_t>(S, (fp->numel() + S - 1) / S * S));
    EXPECT_EQ(fp->shard_numel() * S, fp->padded());
    EXPECT_EQ(fp->master().numel(), fp->shard_numel());
    EXPECT_EQ(fp->grad_shard().numel(), fp->shard_numel());
    numel += fp->numel();
    shard_elems += fp->shard_numel();
    padded += fp->padded();
  }
  EXPECT_EQ(numel, psi) << "every parameter is in exactly one flat";

  const fsdp::MemoryStats ms = e.memory();
  EXPECT_EQ(ms.master_bytes, 4 * shard_elems);
  EXPECT_EQ(ms.grad_bytes, 4 * shard_elems);
  EXPECT_EQ(w->opt->state_bytes(), 8 * shard_elems);  // AdamW: exp_avg + exp_avg_sq
  const int64_t state = ms.master_bytes + ms.grad_bytes + w->opt->state_bytes();
  EXPECT_EQ(state * S, 16 * padded);  // exact: 16 B per padded element, split S ways
  const int64_t nflats = static_cast<int64_t>(e.flat_params().size());
  if (k.strategy == fsdp::Strategy::NoShard) {
    EXPECT_EQ(state, 16 * psi);  // replicated, no padding at S = 1
  } else {
    // 16Psi/S within 5%, plus at most S-1 padding elements per flat.
    EXPECT_LE(double(state), 1.05 * 16.0 * double(psi) / S + 16.0 * double(nflats));
  }
  if (k.strategy == fsdp::Strategy::FullShard || k.strategy == fsdp::Strategy::ShardGradOp)
    EXPECT_EQ(S, world_size());
}

TEST_P(EngineMemory, PeaksAndReshardAfterAStep) {
  const Config k = GetParam();
  auto w = wrap(k);
  fsdp::Engine& e = *w->engine;
  const std::vector<int64_t> unit_bytes = unit_full_bytes(e);
  const int64_t root = unit_bytes[0];
  const int64_t block = *std::max_element(unit_bytes.begin() + 1, unit_bytes.end());
  int64_t all = 0;
  for (int64_t b : unit_bytes) all += b;
  EXPECT_EQ(e.memory().live_unsharded_bytes, 0) << "nothing unsharded before the first forward";

  at::Tensor batch = global_batch(world_size() * kMicro);
  for (int step = 0; step < 2; ++step) train_step(*w, batch);  // step 2 runs with the recorded order
  const fsdp::MemoryStats ms = e.memory();
  if (world_rank() == 0)
    std::printf("  %s: root %lld B, largest block %lld B, all units %lld B; peak unsharded %lld B "
                "(= root + %.2f blocks), peak grad buffers %lld B, max gathers in flight %d\n",
                k.name.c_str(), (long long)root, (long long)block, (long long)all, (long long)ms.peak_unsharded_bytes,
                block ? double(ms.peak_unsharded_bytes - root) / double(block) : 0.0,
                (long long)ms.peak_grad_buffer_bytes, ms.max_all_gathers_in_flight);

  if (k.strategy == fsdp::Strategy::FullShard || k.strategy == fsdp::Strategy::HybridShard) {
    // The root stays unsharded through forward and backward; a block is unsharded while it
    // runs, plus the one block prefetched ahead of it in backward.
    EXPECT_LE(ms.peak_unsharded_bytes, root + std::max(2, k.limit_all_gathers) * block);
    if (k.limit_all_gathers >= 2) EXPECT_LE(ms.peak_unsharded_bytes, root + k.limit_all_gathers * block);
    if (w->groups.comms.shard_size() > 1 || k.dtype != at::kFloat) EXPECT_GT(ms.peak_unsharded_bytes, root);
  }
  if (k.strategy == fsdp::Strategy::ShardGradOp) EXPECT_EQ(ms.peak_unsharded_bytes, all);
  EXPECT_LE(ms.max_all_gathers_in_flight, k.limit_all_gathers);
  // Gradient buffers (as the engine counts them) never exceed one unsharded copy of the model.
  EXPECT_LE(ms.peak_grad_buffer_bytes, all);
  EXPECT_EQ(ms.live_grad_buffer_bytes, 0);

  if (k.strategy != fsdp::Strategy::NoShard) {
    for (int i = 0; i < e.num_units(); ++i) EXPECT_EQ(e.unit_live_bytes(i), 0) << e.unit_names()[i];
    EXPECT_EQ(e.memory().live_unsharded_bytes, 0);
  }
}

TEST_P(EngineMemory, LossAtStepZeroEqualsOneProcess) {
  const Config k = GetParam();
  const int64_t G = world_size() * kMicro;
  at::Tensor batch = global_batch(G);
  const int64_t T = tiny_spec().seq_len;

  // One process, plain CPU model, same init rule and seed, whole global batch.
  std::shared_ptr<model::Model> ref = model::build_model(tiny_spec(), at::kCPU);
  model::init_parameters(*ref, kSeed);
  double want;
  {
    at::NoGradGuard ng;
    want = ref->loss(batch.narrow(1, 0, T), batch.narrow(1, 1, T)).item<double>();
  }
  auto w = wrap(k);
  const double got = train_step(*w, batch);
  const double tol = k.dtype == at::kFloat ? 1e-5 * std::abs(want) : 2e-2 * std::abs(want);
  EXPECT_NEAR(got, want, tol) << k.name;
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, EngineMemory,
    ::testing::Values(Config{"full_shard", fsdp::Strategy::FullShard},
                      Config{"full_shard_limit1", fsdp::Strategy::FullShard, at::kFloat, 1},
                      Config{"full_shard_bf16", fsdp::Strategy::FullShard, at::kBFloat16},
                      Config{"shard_grad_op", fsdp::Strategy::ShardGradOp},
                      Config{"no_shard", fsdp::Strategy::NoShard},
                      Config{"hybrid_shard", fsdp::Strategy::HybridShard}),
    [](const ::testing::TestParamInfo<Config>& i) { return i.param.name; });

}  // namespace
