// FSDP engine equivalence: every strategy, accumulation, clipping, ignored parameters and
// recomputation give the parameters of plain single-process libtorch training.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <map>
#include <memory>

#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/fsdp/strategy_comms.h"
#include "shardtrain/runtime/device_mesh.h"
#include "shardtrain/runtime/topology.h"
#include "shardtrain/util/names.h"
#include "tiny_transformer.h"

using namespace shardtrain;

namespace {

int world_rank() { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
int world_size() { int n; MPI_Comm_size(MPI_COMM_WORLD, &n); return n; }

struct Case {
  std::string name;
  fsdp::Strategy strategy = fsdp::Strategy::FullShard;
  int accum = 2;
  int simulate_ranks_per_host = 0;  // hybrid: pretend hosts of this many ranks
  std::vector<std::string> ignored;
  bool recompute = false;
  at::ScalarType dtype = at::kFloat;
  int64_t min_num_params = 0;       // 0: wrap by type
  fsdp::BackwardPrefetch prefetch = fsdp::BackwardPrefetch::Pre;
  bool forward_prefetch = false;
  std::vector<std::string> frozen;  // parameter-name patterns with requires_grad false (util/names.h)
};

constexpr float kLr = 1e-2f;
constexpr double kClip = 0.5;
// Adam normalises each gradient element: elements whose true gradient is 0 (the attention
// key bias, by softmax shift invariance) carry only rounding noise, which eps=1e-8 would
// turn into full-size steps of random sign. A larger eps keeps the comparison meaningful.
constexpr double kEps = 1e-6;
constexpr int kMicro = 2;  // sequences per rank per micro-batch
constexpr int kSteps = 5;

// Global batch of step s: G sequences of seq+1 tokens, the same on every rank.
at::Tensor global_batch(const tiny::Config& c, int64_t G, int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  return at::randint(c.vocab, {G, c.seq + 1}, gen, at::kLong);
}

// The communicators a strategy uses, built from the mesh the case describes, by the path
// production takes (fsdp::open_groups).
struct Groups {
  fsdp::ShardedGroups g;
  MPI_Comm shard_mpi = MPI_COMM_SELF;
  fsdp::EngineComms comms;
};

Groups make_groups(const Case& k) {
  fsdp::GroupOptions o;
  o.strategy = k.strategy;
  o.simulate_ranks_per_host = fsdp::is_hybrid(k.strategy) ? k.simulate_ranks_per_host : 0;
  o.backend = "mpi";
  o.comm.timeout_s = 120;
  Groups g;
  g.g = fsdp::open_groups(MPI_COMM_WORLD, o);
  g.shard_mpi = g.g.comms.shard_mpi;
  g.comms = g.g.comms.engine();
  return g;
}

// Full fp32 value of every parameter, gathered from the masters.
std::map<std::string, at::Tensor> gather_params(fsdp::Engine& e, MPI_Comm shard) {
  std::map<std::string, at::Tensor> out;
  for (fsdp::FlatParam* fp : e.flat_params()) {
    at::Tensor whole = at::empty({fp->padded()}, at::kFloat);
    const at::Tensor mine = fp->master().to(at::kFloat).contiguous();  // a frozen shard may be bf16
    if (fp->shard_size() == 1)
      whole.copy_(mine);
    else
      MPI_Allgather(mine.data_ptr<float>(), static_cast<int>(fp->shard_numel()), MPI_FLOAT,
                    whole.data_ptr<float>(), static_cast<int>(fp->shard_numel()), MPI_FLOAT, shard);
    for (auto& s : fp->slots()) out[s.name] = whole.narrow(0, s.offset, s.numel).view(s.shape).clone();
  }
  return out;
}

// requires_grad false on the parameters `frozen` names (how train.freeze and LoRA mark them).
void freeze(torch::nn::Module& m, const std::vector<std::string>& frozen) {
  for (auto& p : m.named_parameters())
    if (matches_any(p.key(), frozen)) p.value().requires_grad_(false);
}

struct Reference {
  tiny::Model model;
  std::unique_ptr<torch::optim::AdamW> opt;
  explicit Reference(const tiny::Config& c, const std::vector<std::string>& frozen = {}) : model(c, at::kCPU) {
    std::vector<at::Tensor> decay, no_decay;
    {
      at::NoGradGuard ng;
      for (auto& p : model.named_parameters()) {
        at::Tensor t = p.value();
        tiny::init_param(p.key(), t);
        if (matches_any(p.key(), frozen)) {  // plain libtorch: no gradient, so Adam leaves it alone
          p.value().requires_grad_(false);
          continue;
        }
        bool nd = p.key().find("bias") != std::string::npos || p.key().find("ln_") != std::string::npos;
        (nd ? no_decay : decay).push_back(p.value());
      }
    }
    auto opts = torch::optim::AdamWOptions(kLr).betas({0.9, 0.95}).eps(kEps).weight_decay(0.1);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(opts));
    auto nd = std::make_unique<torch::optim::AdamWOptions>(opts);
    nd->weight_decay(0.0);
    groups.emplace_back(no_decay, std::move(nd));
    opt = std::make_unique<torch::optim::AdamW>(groups, opts);
  }
  double step(const at::Tensor& batch) {
    opt->zero_grad();
    at::Tensor x = batch.narrow(1, 0, batch.size(1) - 1), y = batch.narrow(1, 1, batch.size(1) - 1);
    at::Tensor loss = model.loss(x, y);
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model.parameters(), kClip);
    opt->step();
    return loss.item<double>();
  }
};

void run_case(const Case& k, double rtol, double atol, bool expect_loss_falls = false) {
  optim::KokkosScope kokkos;
  const int D = world_size(), r = world_rank();
  if (k.simulate_ranks_per_host > 0 && D % k.simulate_ranks_per_host) GTEST_SKIP();
  tiny::Config c;
  const int64_t G = static_cast<int64_t>(D) * k.accum * kMicro;
  Reference ref(c, k.frozen);

  Groups g = make_groups(k);
  tiny::Model model(c, at::kMeta);
  freeze(model, k.frozen);
  fsdp::EngineOptions eo;
  eo.strategy = k.strategy;
  eo.wrap_types = k.min_num_params ? std::vector<std::string>{} : std::vector<std::string>{model.blocks[0]->name()};
  eo.min_num_params = k.min_num_params;
  eo.ignored = k.ignored;
  eo.activation_checkpointing = k.recompute;
  eo.mp.param_dtype = k.dtype;
  eo.mp.reduce_dtype = k.dtype == at::kFloat ? at::kFloat : at::kFloat;
  eo.mp.keep_fp32 = {"ln_"};
  eo.backward_prefetch = k.prefetch;
  eo.forward_prefetch = k.forward_prefetch;
  fsdp::Engine engine(model, g.comms, eo, tiny::init_param);
  fsdp::OptimizerConfig oc;
  oc.adamw.beta1 = 0.9f;
  oc.adamw.beta2 = 0.95f;
  oc.adamw.eps = static_cast<float>(kEps);
  oc.adamw.weight_decay = 0.1f;
  oc.no_decay = {"bias", "ln_"};
  fsdp::ShardedOptimizer opt(engine, oc);

  // Same initial values as the reference, whatever the world size.
  for (auto& [name, value] : gather_params(engine, g.shard_mpi)) {
    at::Tensor want = *ref.model.named_parameters().find(name);
    // A frozen shard is kept in the compute dtype: the reference's value rounded to it.
    if (k.dtype != at::kFloat && matches_any(name, k.frozen)) want = want.detach().to(k.dtype).to(at::kFloat);
    ASSERT_TRUE(at::equal(value, want)) << k.name << ": initial " << name;
  }

  double first_loss = 0, last_loss = 0, max_rel = 0;
  for (int step = 0; step < kSteps; ++step) {
    // One fixed batch: the loss must fall as the model fits it.
    at::Tensor batch = global_batch(c, G, 0);
    double ref_loss = ref.step(batch);

    engine.zero_grad();
    double local = 0;
    for (int a = 0; a < k.accum; ++a) {
      engine.set_last_micro_batch(a == k.accum - 1);
      at::Tensor mine = batch.narrow(0, (static_cast<int64_t>(r) * k.accum + a) * kMicro, kMicro);
      at::Tensor loss = model.loss(mine.narrow(1, 0, c.seq), mine.narrow(1, 1, c.seq)) / k.accum;
      loss.backward();
      local += loss.item<double>();
    }
    double total = 0;
    MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    total /= D;
    EXPECT_NEAR(total, ref_loss, 1e-5 * std::abs(ref_loss) + (k.dtype == at::kFloat ? 0 : 0.05))
        << k.name << " step " << step;
    double norm = engine.clip_grad_norm(kClip);
    EXPECT_GT(norm, kClip) << "clipping should be active";
    opt.step(kLr);
    if (step == 0) first_loss = total;
    last_loss = total;

    double diff2 = 0, norm2 = 0;
    for (auto& [name, value] : gather_params(engine, g.shard_mpi)) {
      at::Tensor want = *ref.model.named_parameters().find(name);
      // Any single element within atol: Adam normalises each element, so one whose
      // gradient is near zero moves by a rounding-sized fraction of a step.
      double worst = (value - want).abs().max().item<double>();
      if (atol > 0) EXPECT_LE(worst, atol) << k.name << " step " << step << " param " << name;
      diff2 += (value - want).pow(2).sum().item<double>();
      norm2 += want.pow(2).sum().item<double>();
    }
    // The model's parameters as one vector: relative L2 error.
    double rel = std::sqrt(diff2 / norm2);
    EXPECT_LE(rel, rtol) << k.name << " step " << step;
    max_rel = std::max(max_rel, rel);
  }
  if (world_rank() == 0) std::printf("  %s: max relative parameter error %.2e\n", k.name.c_str(), max_rel);
  if (!k.frozen.empty()) {
    // Frozen parameters: bitwise their initial values; only trainable flats hold gradients and
    // optimizer state, and frozen shards sit in the compute dtype (the engine's own counters).
    int64_t trainable = 0, frozen_bytes = 0;
    for (fsdp::FlatParam* fp : engine.flat_params()) {
      if (fp->frozen()) {
        EXPECT_FALSE(fp->grad_shard().defined());
        frozen_bytes += fp->shard_numel() * static_cast<int64_t>(c10::elementSize(fp->dtype()));
      } else {
        trainable += fp->shard_numel();
      }
    }
    ASSERT_GT(frozen_bytes, 0) << k.name << ": nothing frozen";
    const fsdp::MemoryStats m = engine.memory();
    EXPECT_EQ(m.grad_bytes, 4 * trainable) << k.name;
    EXPECT_EQ(m.master_bytes, 4 * trainable) << k.name;
    EXPECT_EQ(m.frozen_bytes, frozen_bytes) << k.name;
    EXPECT_EQ(opt.state_bytes(), 8 * trainable) << k.name;
    tiny::Model init(c, at::kCPU);
    at::NoGradGuard ng;
    for (auto& [name, value] : gather_params(engine, g.shard_mpi)) {
      if (!matches_any(name, k.frozen)) continue;
      at::Tensor want = *init.named_parameters().find(name);
      tiny::init_param(name, want);
      EXPECT_TRUE(at::equal(value, k.dtype == at::kFloat ? want : want.to(k.dtype).to(at::kFloat)))
          << k.name << ": frozen " << name << " changed";
    }
  }
  if (expect_loss_falls) EXPECT_LT(last_loss, first_loss - 0.05) << k.name;
  // Everything resharded between steps (except no_shard, which keeps parameters).
  if (k.strategy != fsdp::Strategy::NoShard)
    for (int i = 0; i < engine.num_units(); ++i) EXPECT_EQ(engine.unit_live_bytes(i), 0) << engine.unit_names()[i];
}

// 1e-5 relative over the model; any element within 1% of one step (lr = 1e-2).
constexpr double kRtol = 1e-5, kAtol = 1e-4;

}  // namespace

TEST(FsdpEquivalence, FullShard) { run_case({"full_shard", fsdp::Strategy::FullShard}, kRtol, kAtol); }
TEST(FsdpEquivalence, ShardGradOp) { run_case({"shard_grad_op", fsdp::Strategy::ShardGradOp}, kRtol, kAtol); }
TEST(FsdpEquivalence, NoShard) { run_case({"no_shard", fsdp::Strategy::NoShard}, kRtol, kAtol); }
TEST(FsdpEquivalence, HybridShardTwoRanksPerHost) {
  Case k{"hybrid_shard", fsdp::Strategy::HybridShard};
  k.simulate_ranks_per_host = world_size() % 2 == 0 ? 2 : world_size();
  run_case(k, kRtol, kAtol);
}
TEST(FsdpEquivalence, HybridShardZero2OneRankPerHost) {
  Case k{"hybrid_shard_zero2", fsdp::Strategy::HybridShardZero2};
  k.simulate_ranks_per_host = 1;
  run_case(k, kRtol, kAtol);
}
TEST(FsdpEquivalence, AccumulateFourMicroBatches) {
  Case k{"full_shard accum 4", fsdp::Strategy::FullShard};
  k.accum = 4;
  run_case(k, kRtol, kAtol);
}
TEST(FsdpEquivalence, IgnoredEmbeddingsAndRecomputation) {
  Case k{"full_shard ignored+recompute", fsdp::Strategy::FullShard};
  k.ignored = {"wpe"};
  k.recompute = true;
  k.prefetch = fsdp::BackwardPrefetch::Post;
  k.forward_prefetch = true;
  run_case(k, kRtol, kAtol);
}
TEST(FsdpEquivalence, HybridWithIgnoredAndRecompute) {
  Case k{"hybrid ignored+recompute", fsdp::Strategy::HybridShard};
  k.simulate_ranks_per_host = world_size() % 2 == 0 ? 2 : 1;
  k.ignored = {"wpe"};
  k.recompute = true;
  run_case(k, kRtol, kAtol);
}
TEST(FsdpEquivalence, SizeBasedWrapPolicy) {
  Case k{"full_shard size policy", fsdp::Strategy::FullShard};
  k.min_num_params = 1000;
  k.prefetch = fsdp::BackwardPrefetch::None;
  run_case(k, kRtol, kAtol);
}
// Frozen parameters (train.freeze, a LoRA base): units that mix frozen and trainable parameters,
// a block frozen whole that gradients still pass through to trainable embeddings, under
// recomputation and hybrid sharding; the same parameters as plain libtorch with those frozen.
TEST(FsdpFrozen, MixedUnits) {
  Case k{"full_shard frozen qkv+fc+wte", fsdp::Strategy::FullShard};
  k.frozen = {"attn_qkv_weight", "mlp_fc_weight", "wte_weight"};
  run_case(k, kRtol, kAtol);
}
TEST(FsdpFrozen, WholeBlockRecomputeHybrid) {
  Case k{"hybrid frozen h0 + recompute", fsdp::Strategy::HybridShard};
  k.simulate_ranks_per_host = world_size() % 2 == 0 ? 2 : 1;
  k.frozen = {"h0.*", "ln_f_*"};
  k.recompute = true;
  k.accum = 3;
  run_case(k, kRtol, kAtol);
}
TEST(FsdpFrozen, ShardGradOpIgnoredAndFrozen) {
  Case k{"shard_grad_op frozen wpe (ignored) + h1 proj", fsdp::Strategy::ShardGradOp};
  k.ignored = {"wpe"};
  k.frozen = {"wpe_weight", "h1.attn_proj_weight"};
  run_case(k, kRtol, kAtol);
}
TEST(FsdpFrozen, Bf16FrozenShardsInBf16) {
  Case k{"no_shard bf16 frozen mlp", fsdp::Strategy::NoShard};
  k.dtype = at::kBFloat16;
  k.frozen = {"*mlp_*_weight"};
  run_case(k, 0.02, 0, /*expect_loss_falls=*/true);
}

// bf16 steps differ from fp32 ones by bf16 rounding of the gradients, which Adam then
// normalises: within 2% over the model after five steps, and the loss falls.
TEST(FsdpMixedPrecision, Bf16TracksFp32AndTrains) {
  Case k{"full_shard bf16", fsdp::Strategy::FullShard};
  k.dtype = at::kBFloat16;
  run_case(k, 0.02, 0, /*expect_loss_falls=*/true);
}
TEST(FsdpMixedPrecision, Bf16HybridZero2) {
  Case k{"hybrid_shard_zero2 bf16", fsdp::Strategy::HybridShardZero2};
  k.dtype = at::kBFloat16;
  k.simulate_ranks_per_host = world_size() % 2 == 0 ? 2 : 1;
  run_case(k, 0.02, 0, /*expect_loss_falls=*/true);
}

// fsdp.cpu_offload on a CPU device: nothing moves (host memory is the device), but the engine
// runs the offload flow (masters never alias the unsharded storage, gradients are staged and
// added into the host shards after backward). Parameters and losses must equal the plain run's
// bit for bit, step after step.
void run_offload_pair(const Case& k) {
  optim::KokkosScope kokkos;
  const int D = world_size(), r = world_rank();
  if (k.simulate_ranks_per_host > 0 && D % k.simulate_ranks_per_host) GTEST_SKIP();
  tiny::Config c;
  const int64_t G = static_cast<int64_t>(D) * k.accum * kMicro;
  struct Run {
    Groups g;
    std::unique_ptr<tiny::Model> model;
    std::unique_ptr<fsdp::Engine> engine;
    std::unique_ptr<fsdp::ShardedOptimizer> opt;
  };
  auto make = [&](bool offload) {
    Run run;
    run.g = make_groups(k);
    run.model = std::make_unique<tiny::Model>(c, at::kMeta);
    fsdp::EngineOptions eo;
    eo.strategy = k.strategy;
    eo.wrap_types = {run.model->blocks[0]->name()};
    eo.ignored = k.ignored;
    eo.activation_checkpointing = k.recompute;
    eo.mp.param_dtype = k.dtype;
    eo.mp.keep_fp32 = {"ln_"};
    eo.backward_prefetch = k.prefetch;
    eo.forward_prefetch = k.forward_prefetch;
    eo.cpu_offload = offload;
    run.engine = std::make_unique<fsdp::Engine>(*run.model, run.g.comms, eo, tiny::init_param);
    fsdp::OptimizerConfig oc;
    oc.adamw.beta2 = 0.95f;
    oc.adamw.eps = static_cast<float>(kEps);
    oc.adamw.weight_decay = 0.1f;
    oc.no_decay = {"bias", "ln_"};
    oc.host_threads = offload ? 3 : 1;  // the threaded host step must not change a bit either
    run.opt = std::make_unique<fsdp::ShardedOptimizer>(*run.engine, oc);
    return run;
  };
  Run base = make(false), off = make(true);
  for (fsdp::FlatParam* fp : off.engine->flat_params()) {
    EXPECT_TRUE(fp->offloaded());
    EXPECT_FALSE(fp->aliases_master());
    EXPECT_TRUE(fp->master().device().is_cpu());
  }
  for (int step = 0; step < kSteps; ++step) {
    at::Tensor batch = global_batch(c, G, step);
    double losses[2] = {0, 0}, norms[2] = {0, 0};
    Run* runs[2] = {&base, &off};
    for (int w = 0; w < 2; ++w) {
      Run& run = *runs[w];
      run.engine->zero_grad();
      for (int a = 0; a < k.accum; ++a) {
        run.engine->set_last_micro_batch(a == k.accum - 1);
        at::Tensor mine = batch.narrow(0, (static_cast<int64_t>(r) * k.accum + a) * kMicro, kMicro);
        at::Tensor loss = run.model->loss(mine.narrow(1, 0, c.seq), mine.narrow(1, 1, c.seq)) / k.accum;
        loss.backward();
        losses[w] += loss.item<double>();
      }
      norms[w] = run.engine->clip_grad_norm(kClip);
      run.opt->step(kLr);
    }
    EXPECT_EQ(losses[0], losses[1]) << k.name << " step " << step;
    EXPECT_EQ(norms[0], norms[1]) << k.name << " step " << step;
    auto pb = base.engine->flat_params(), po = off.engine->flat_params();
    ASSERT_EQ(pb.size(), po.size());
    for (size_t i = 0; i < pb.size(); ++i) {
      EXPECT_TRUE(at::equal(pb[i]->master(), po[i]->master())) << k.name << " step " << step << " flat " << i;
      EXPECT_TRUE(at::equal(pb[i]->grad_shard(), po[i]->grad_shard())) << k.name << " step " << step << " flat " << i;
    }
  }
  if (k.strategy != fsdp::Strategy::NoShard)
    for (int i = 0; i < off.engine->num_units(); ++i)
      if (off.engine->unit_names()[i] != "<ignored>") EXPECT_EQ(off.engine->unit_live_bytes(i), 0);
}

TEST(FsdpCpuOffload, FullShardEqualsPlainRunBitForBit) {
  run_offload_pair({"offload full_shard", fsdp::Strategy::FullShard});
}
TEST(FsdpCpuOffload, NoShardEqualsPlainRunBitForBit) {
  run_offload_pair({"offload no_shard", fsdp::Strategy::NoShard});
}
TEST(FsdpCpuOffload, Bf16HybridZero2IgnoredRecomputeEqualsPlainRun) {
  Case k{"offload hybrid_shard_zero2 bf16 ignored+recompute", fsdp::Strategy::HybridShardZero2};
  k.dtype = at::kBFloat16;
  k.simulate_ranks_per_host = world_size() % 2 == 0 ? 2 : 1;
  k.ignored = {"wpe"};
  k.recompute = true;
  k.accum = 3;
  k.forward_prefetch = true;
  run_offload_pair(k);
}

// Under full_shard a block's unsharded storage holds 0 bytes outside its forward and
// backward, and no more than limit_all_gathers unshards are ever in flight.
TEST(FsdpMemory, BlocksFreeTheirStorageAndGathersAreLimited) {
  optim::KokkosScope kokkos;
  for (int limit : {1, 2}) {
    tiny::Config c;
    Groups g = make_groups({"full_shard", fsdp::Strategy::FullShard});
    tiny::Model model(c, at::kMeta);
    fsdp::EngineOptions eo;
    eo.wrap_types = {model.blocks[0]->name()};
    eo.forward_prefetch = true;
    eo.limit_all_gathers = limit;
    fsdp::Engine engine(model, g.comms, eo, tiny::init_param);
    ASSERT_EQ(engine.num_units(), 1 + c.layers);
    for (int step = 0; step < 3; ++step) {
      at::Tensor batch = global_batch(c, 2, step);
      engine.set_last_micro_batch(true);
      at::Tensor loss = model.loss(batch.narrow(1, 0, c.seq), batch.narrow(1, 1, c.seq));
      // After forward: the root is still gathered for backward, blocks are not.
      if (world_size() > 1) EXPECT_GT(engine.unit_live_bytes(0), 0);
      for (int i = 1; i < engine.num_units(); ++i) EXPECT_EQ(engine.unit_live_bytes(i), 0) << "after forward, unit " << i;
      loss.backward();
      for (int i = 0; i < engine.num_units(); ++i) EXPECT_EQ(engine.unit_live_bytes(i), 0) << "after backward, unit " << i;
      for (fsdp::FlatParam* fp : engine.flat_params()) fp->write_master();  // the next forward re-gathers
    }
    fsdp::MemoryStats m = engine.memory();
    EXPECT_LE(m.max_all_gathers_in_flight, limit);
    if (world_size() > 1) EXPECT_GE(m.max_all_gathers_in_flight, 1);
    EXPECT_EQ(m.live_unsharded_bytes, 0);
    if (world_size() > 1) EXPECT_GT(m.peak_unsharded_bytes, 0);
  }
}
