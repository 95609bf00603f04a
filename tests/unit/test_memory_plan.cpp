// Memory planner formulas: flat layouts against the model, 16Psi/N state, padding, unsharded
// buffers per strategy, communication volumes, saved activations, recommendation, sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/quantize.h"
#include "shardtrain/fsdp/wrap.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/model.h"
#include "shardtrain/deck/deck.h"
#include "shardtrain/plan/bytes.h"
#include "shardtrain/plan/strategy_plan.h"
#include "shardtrain/plan/tables.h"
#include "shardtrain/train/plan_settings.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;
using plan::PlanSettings;
using plan::StrategyPlan;

namespace {

// d = 32: every flat of this GPT-2 has a numel divisible by 4 (so no padding at N = 2, 4).
PlanSettings gpt2(int ranks, int per_host) {
  PlanSettings ps;
  model::ModelSpec s;
  s.arch = "gpt2";
  s.vocab_size = 64;
  s.seq_len = 16;
  s.d_model = 32;
  s.n_layers = 3;
  s.n_heads = 4;
  ps.spec = model::resolve_spec(s);
  ps.engine.wrap_types = {"GPT2Block"};
  ps.engine.mp.keep_fp32 = {"norm", "ln_"};
  ps.micro_batch = 2;
  ps.ranks = ranks;
  ps.ranks_per_host = per_host;
  return ps;
}

int64_t psi(const PlanSettings& ps) { return model::parameter_count(ps.spec); }

// The engine's layout of the deck's model (unpadded: one rank).
std::vector<fsdp::UnitPlan> layout(const PlanSettings& ps) {
  return fsdp::plan_units(*model::build_model(ps.spec, at::kMeta), ps.engine, 1);
}

}  // namespace

TEST(MemoryPlan, UnitsMatchTheModel) {
  PlanSettings ps = gpt2(4, 4);
  auto units = layout(ps);
  ASSERT_EQ(units.size(), 4u);  // root + 3 blocks
  EXPECT_EQ(units[0].name, "<root>");
  EXPECT_EQ(units[1].name, "transformer.h.0");
  int64_t total = 0;
  for (const auto& u : units) total += u.numel();
  EXPECT_EQ(total, psi(ps));
  // The root holds wte, wpe and ln_f (tied head: no extra parameter).
  const int64_t d = 32;
  EXPECT_EQ(units[0].numel(), 64 * d + 16 * d + 2 * d);
  ASSERT_EQ(units[0].flats.size(), 1u);  // fp32: one flat per unit
  EXPECT_EQ(units[0].flats[0].params.front().name, "transformer.wte.weight");
}

TEST(MemoryPlan, TenThousandLayersPlanInLinearTime) {
  // A config.json may declare 10,000 layers: building the model on meta and planning its units
  // must cost time linear in them (a scan of every parameter for every module took minutes).
  PlanSettings ps = gpt2(1, 1);
  ps.spec.n_layers = 10000;
  ps.engine.wrap_types = {"GPT2Block"};
  ps.engine.ignored = {"transformer.h.9999.mlp.c_proj.bias"};  // the ignored group's path too
  const auto t0 = std::chrono::steady_clock::now();
  auto units = layout(ps);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(units.size(), 10002u);  // root, 10,000 blocks, the ignored group
  EXPECT_EQ(units[1].name, "transformer.h.0");
  EXPECT_EQ(units[10000].name, "transformer.h.9999");
  EXPECT_EQ(units[10000].num_params(), 11);  // a block's 12 parameters, one ignored
  EXPECT_EQ(units[10001].name, "<ignored>");
  int64_t total = 0;
  for (const auto& u : units) total += u.numel();
  EXPECT_EQ(total, psi(ps));
  EXPECT_LT(s, 30.0) << "planning units is not linear in the layers";  // seconds, not minutes
}

TEST(MemoryPlan, MixedPrecisionSplitsNormsIntoAnFp32Flat) {
  PlanSettings ps = gpt2(2, 2);
  ps.engine.mp.param_dtype = at::kBFloat16;
  auto units = layout(ps);
  ASSERT_EQ(units[1].flats.size(), 2u);
  EXPECT_EQ(units[1].flats[0].dtype, at::kBFloat16);
  EXPECT_EQ(units[1].flats[1].dtype, at::kFloat);
  EXPECT_EQ(units[1].flats[1].numel, 4 * 32);  // ln_1 and ln_2 weight + bias
}

TEST(MemoryPlan, FullShardStateIs16PsiOverN) {
  for (int n : {1, 2, 4}) {
    PlanSettings ps = gpt2(n, n);
    StrategyPlan p = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
    EXPECT_EQ(p.shard_size, n);
    EXPECT_EQ(p.mem.params + p.mem.grads + p.mem.optim, 16 * psi(ps) / n) << n << " ranks";
    EXPECT_EQ(p.mem.optim, 8 * psi(ps) / n);
  }
  // no_shard keeps 16 Psi on every rank; fp32 parameters alias the masters: no buffers.
  PlanSettings ps = gpt2(4, 4);
  StrategyPlan ns = plan::plan_strategy(ps, fsdp::Strategy::NoShard);
  EXPECT_EQ(ns.mem.state(), 16 * psi(ps));
  EXPECT_EQ(ns.mem_no_recompute.unsharded, 0);
  EXPECT_EQ(ns.mem_no_recompute.grad_buffers, 0);
  // SGD without momentum has no state.
  ps.optimizer = "sgd";
  ps.sgd_momentum = 0;
  EXPECT_EQ(plan::plan_strategy(ps, fsdp::Strategy::FullShard).mem.optim, 0);
}

TEST(MemoryPlan, PaddingRoundsEveryFlatUpToTheGroupSize) {
  PlanSettings ps = gpt2(4, 4);
  ps.spec.vocab_size = 97;
  ps.spec.d_model = 30;  // every flat numel is 2 mod 4
  ps.spec.n_heads = 3;
  ps.spec.n_kv_heads = 0;
  ps.spec = model::resolve_spec(ps.spec);
  StrategyPlan p = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  int64_t padded = 0;
  for (const auto& u : p.units)
    for (const auto& f : u.flats) {
      EXPECT_EQ(f.padded % 4, 0);
      EXPECT_EQ(f.padded - f.numel, 2);
      EXPECT_EQ(f.shard_numel, f.padded / 4);
      padded += f.padded;
    }
  EXPECT_EQ(p.mem.state(), 16 * padded / 4);
  EXPECT_GT(p.mem.state(), 16 * psi(ps) / 4);
}

TEST(MemoryPlan, UnshardedBuffersFollowTheStrategy) {
  PlanSettings ps = gpt2(4, 4);
  auto units = layout(ps);
  const int64_t root = units[0].numel() * 4, block = units[1].numel() * 4;
  // ZeRO-3 at the last block's backward: root + the block + the prefetched one; gradient
  // buffers for the root and the block.
  StrategyPlan fs = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  StrategyPlan sgo = plan::plan_strategy(ps, fsdp::Strategy::ShardGradOp);
  ASSERT_EQ(fs.mem.peak_at, "last block backward");
  EXPECT_EQ(fs.mem.unsharded, root + 2 * block);
  EXPECT_EQ(fs.mem.grad_buffers, root + block);
  // ZeRO-2 keeps every block from its forward to its backward.
  ASSERT_EQ(sgo.mem.peak_at, "last block backward");
  EXPECT_EQ(sgo.mem.unsharded, root + 3 * block);
  EXPECT_EQ(sgo.mem.total - fs.mem.total, block);
}

TEST(MemoryPlan, CommunicationVolumes) {
  PlanSettings ps = gpt2(4, 2);  // 2 hosts of 2
  auto units = layout(ps);
  const double root = units[0].numel(), blocks = psi(ps) - root, all = psi(ps);
  StrategyPlan fs = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  EXPECT_EQ(fs.comm.all_gather, static_cast<int64_t>(0.75 * (root + 2 * blocks) * 4));
  EXPECT_EQ(fs.comm.reduce_scatter, static_cast<int64_t>(0.75 * all * 4));
  EXPECT_EQ(fs.comm.all_reduce, 0);
  EXPECT_EQ(fs.comm.inter_host, fs.comm.total());  // the shard group spans both hosts
  StrategyPlan sgo = plan::plan_strategy(ps, fsdp::Strategy::ShardGradOp);
  EXPECT_EQ(sgo.comm.all_gather, static_cast<int64_t>(0.75 * all * 4));
  StrategyPlan ns = plan::plan_strategy(ps, fsdp::Strategy::NoShard);
  EXPECT_EQ(ns.comm.all_reduce, static_cast<int64_t>(1.5 * all * 4));  // 2(N-1)/N
  EXPECT_EQ(ns.comm.all_gather + ns.comm.reduce_scatter, 0);
  // Hybrid: shard inside a host (intra), average across the 2 replicas (inter).
  StrategyPlan hs = plan::plan_strategy(ps, fsdp::Strategy::HybridShard);
  EXPECT_EQ(hs.shard_size, 2);
  EXPECT_EQ(hs.replicate_size, 2);
  EXPECT_EQ(hs.comm.all_gather, static_cast<int64_t>(0.5 * (root + 2 * blocks) * 4));
  EXPECT_EQ(hs.comm.all_reduce, static_cast<int64_t>(1.0 * all / 2 * 4));
  EXPECT_EQ(hs.comm.intra_host, hs.comm.all_gather + hs.comm.reduce_scatter);
  EXPECT_EQ(hs.comm.inter_host, hs.comm.all_reduce);
  // A host's link: full_shard's and no_shard's rings leave each host once; hybrid's two
  // replicate rings ({0,2}, {1,3}) both leave host 0 (what the veth counters of
  // perf/cluster/run.sh measure).
  EXPECT_NEAR(fs.comm.inter_host_link, fs.comm.inter_host, 2);
  EXPECT_NEAR(ns.comm.inter_host_link, ns.comm.all_reduce, 2);
  EXPECT_NEAR(hs.comm.inter_host_link, 2 * hs.comm.all_reduce, 2);
  // On one host nothing crosses a link.
  EXPECT_EQ(plan::plan_strategy(gpt2(4, 4), fsdp::Strategy::FullShard).comm.inter_host_link, 0);
  // Gradient accumulation multiplies the per-micro-batch collectives only.
  ps.grad_accum = 3;
  StrategyPlan hs3 = plan::plan_strategy(ps, fsdp::Strategy::HybridShard);
  EXPECT_NEAR(hs3.comm.all_gather, 3.0 * hs.comm.all_gather, 3);
  EXPECT_EQ(hs3.comm.all_reduce, hs.comm.all_reduce);
}

TEST(MemoryPlan, SavedActivationsOfAGpt2Block) {
  // fp32 GPT-2 block: 32nd + 8nf + 4 B H T^2 + T^2 (causal mask) + 16n bytes, as counted
  // tensor by tensor (docs/memory-planner.md).
  model::ModelSpec s;
  s.arch = "gpt2";
  s.vocab_size = 50;
  s.seq_len = 128;
  s.d_model = 64;
  s.n_heads = 4;
  s.n_layers = 2;
  fsdp::MixedPrecision mp;
  plan::ActivationBytes a = plan::activation_bytes(s, mp, 2);
  const int64_t n = 256, d = 64, f = 256, attn = 2 * 4 * 128 * 128;
  ASSERT_EQ(a.blocks.size(), 2u);
  EXPECT_EQ(a.blocks[1].saved, 32 * n * d + 8 * n * f + 4 * attn + 128 * 128 + 16 * n);
  // Recomputation keeps one block input per block.
  EXPECT_EQ(a.block_io, 4 * n * d);
  EXPECT_LT(a.saved(true), a.saved(false));
}

TEST(MemoryPlan, RecommendsTheCheapestThatFits) {
  PlanSettings ps = gpt2(4, 2);
  // This model's flats are a few KB: at the default 10 us per ring step latency decides, and
  // no_shard's one all-reduce (6 ring steps) beats the sharded strategies' per-unit collectives.
  {
    auto plans = plan::plan_all(ps);
    bool rc = true;
    EXPECT_EQ(plans[plan::recommend(plans, int64_t(1) << 40, &rc)].strategy, fsdp::Strategy::NoShard);
  }
  ps.step.latency_us = 0;  // the bytes alone
  auto plans = plan::plan_all(ps);
  ASSERT_EQ(plans.size(), 5u);
  bool rc = true;
  int best = plan::recommend(plans, int64_t(1) << 40, &rc);
  ASSERT_GE(best, 0);
  EXPECT_FALSE(rc);
  // hybrid_shard_zero2: intra-host sharding and a quarter-size inter-host all-reduce.
  EXPECT_EQ(plans[best].strategy, fsdp::Strategy::HybridShardZero2);
  // Just above full_shard's peak with recomputation: only that fits.
  const StrategyPlan* fs = nullptr;
  for (const auto& p : plans)
    if (p.strategy == fsdp::Strategy::FullShard) fs = &p;
  int64_t least = fs->mem_recompute.total;
  for (const auto& p : plans) least = std::min(least, std::min(p.mem_no_recompute.total, p.mem_recompute.total));
  best = plan::recommend(plans, least, &rc);
  ASSERT_GE(best, 0);
  EXPECT_EQ(plan::recommend(plans, least - 1, &rc), -1);
  // The report names the recommendation and draws a diagram per strategy.
  const std::string text = plan::format_plan(ps, plans, int64_t(1) << 40);
  EXPECT_NE(text.find("recommendation: parallel.strategy = \"hybrid_shard_zero2\""), std::string::npos) << text;
  EXPECT_NE(text.find("sharding: full_shard"), std::string::npos);
  EXPECT_NE(text.find("[0000"), std::string::npos) << text;
}

// Rings that share a host's link at once: without measured weights the link splits evenly
// (W x edges); a measured W2 prices hybrid's two replicate rings on one link. On the namespace
// cluster's 250 Mbit/s link two concurrent flows got much less than half each, and no_shard (one
// world ring, one flow per link) measured faster than hybrid_shard_zero2 (perf/README.md).
TEST(MemoryPlan, MeasuredSharedLinkWeightPricesConcurrentRings) {
  PlanSettings ps = gpt2(4, 2);
  ps.inter_host_weight = 8;
  EXPECT_EQ(plan::link_weight(ps, 0), 1.0);
  EXPECT_EQ(plan::link_weight(ps, 1), 8.0);
  EXPECT_EQ(plan::link_weight(ps, 2), 16.0);
  ps.shared_link_weights = {40};
  EXPECT_EQ(plan::link_weight(ps, 2), 40.0);
  EXPECT_EQ(plan::link_weight(ps, 3), 24.0);  // past the list: the even split
  const StrategyPlan hz = plan::plan_strategy(ps, fsdp::Strategy::HybridShardZero2);
  const StrategyPlan ns = plan::plan_strategy(ps, fsdp::Strategy::NoShard);
  // hybrid: the shard groups' collectives stay on the host (x 1), the replicate all-reduce's two
  // rings share host 0's link (x W2); no_shard: one world ring, one edge per link (x W).
  const double hz_want = static_cast<double>(hz.comm.all_gather + hz.comm.reduce_scatter) + 40.0 * hz.comm.all_reduce;
  EXPECT_NEAR(hz.comm_cost, hz_want, 1e-6 * hz_want + 64);
  EXPECT_NEAR(ns.comm_cost, 8.0 * ns.comm.all_reduce, 1e-6 * ns.comm_cost + 16);
  EXPECT_LT(ns.comm_cost, hz.comm_cost);
  auto plans = plan::plan_all(ps);
  bool rc = true;
  const int best = plan::recommend(plans, int64_t(1) << 40, &rc);
  ASSERT_GE(best, 0);
  EXPECT_FALSE(fsdp::is_hybrid(plans[best].strategy)) << fsdp::to_string(plans[best].strategy);
  // With the even split (W2 = 2 W = 16) hybrid_shard_zero2 is the cheaper (RecommendsTheCheapestThatFits).
  ps.shared_link_weights.clear();
  EXPECT_GT(plan::plan_strategy(ps, fsdp::Strategy::NoShard).comm_cost,
            plan::plan_strategy(ps, fsdp::Strategy::HybridShardZero2).comm_cost);
}

TEST(MemoryPlan, CpuOffloadKeepsTheStateOutOfTheDevicePeak) {
  PlanSettings ps = gpt2(1, 1);
  StrategyPlan resident = plan::plan_strategy(ps, fsdp::Strategy::NoShard);
  ps.engine.cpu_offload = true;
  StrategyPlan off = plan::plan_strategy(ps, fsdp::Strategy::NoShard);
  EXPECT_TRUE(off.mem.state_on_host);
  EXPECT_EQ(off.mem.state(), resident.mem.state());  // same shards, in host memory
  // The master no longer doubles as the compute buffer: an unsharded copy on the device.
  EXPECT_EQ(resident.mem_no_recompute.unsharded, 0);
  EXPECT_GT(off.mem_no_recompute.unsharded, 0);
  EXPECT_EQ(off.mem.total, off.mem.unsharded + off.mem.grad_buffers + off.mem.activations);
  EXPECT_LT(off.mem.total, resident.mem.total);
}

// The program hands the deck layer (below the model layer) the model's architectures and presets.
TEST(DeckSetup, ArchChoicesAreTheModelArchitectures) {
  train::register_model_choices();
  const deck::KeySpec* k = deck::find_key("model.arch");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->choices, model::arch_names());
}

// The deck layer lists model.preset's choices itself (it sits below the model layer): they must
// be exactly the model's presets, and each must resolve through the trainer's deck reading.
TEST(DeckSetup, PresetChoicesAreTheModelPresets) {
  train::register_model_choices();
  const deck::KeySpec* k = deck::find_key("model.preset");
  ASSERT_NE(k, nullptr);
  std::vector<std::string> choices;
  for (const std::string& c : k->choices)
    if (!c.empty()) choices.push_back(c);
  std::vector<std::string> presets = model::preset_names();
  std::sort(choices.begin(), choices.end());
  std::sort(presets.begin(), presets.end());
  EXPECT_EQ(choices, presets);
  for (const std::string& p : presets) {
    const std::string arch = model::preset_spec(p).arch;  // the deck checks the preset fits model.arch
    deck::Deck d = deck::Deck::parse("[model]\narch = \"" + arch + "\"\npreset = \"" + p + "\"\n", "preset.toml");
    const model::ModelSpec s = train::model_spec_from_deck(d);
    EXPECT_EQ(model::parameter_count(s), model::parameter_count(model::resolve_spec(model::preset_spec(p)))) << p;
  }
}

// fsdp.quantize_*: the planner's inter-host bytes per option follow the wire format (int8 codes
// plus an fp32 scale per block), and hpZ's secondary shards cost 1/node of each block's
// unsharded bytes from the end of forward (the engine's own count: test_zeropp).
TEST(MemoryPlan, QuantizedCollectivesAndSecondaryShards) {
  PlanSettings ps = gpt2(4, 2);
  ps.engine.compression.block = 64;
  ps.engine.compression.guard_every = 0;  // no amortised exact collectives in the numbers
  StrategyPlan h = plan::plan_strategy(ps, fsdp::Strategy::HybridShard);
  // Plain: the replica all-reduce of fp32 shards (2 replicas: 2(R-1)/R = 1 shard each).
  int64_t shard_fp32 = 0, packed = 0;
  for (const auto& u : h.units)
    for (const auto& f : u.flats) {
      shard_fp32 += 4 * f.shard_numel;
      packed += fsdp::quantized_bytes(f.shard_numel, 64);
    }
  EXPECT_EQ(h.inter_host_plain, shard_fp32);
  EXPECT_EQ(h.inter_host_qgz, packed);
  EXPECT_EQ(h.inter_host_qwz, h.inter_host_plain);  // hybrid's gathers stay inside the host
  EXPECT_EQ(h.inter_host_hpz, -1);                  // not a hybrid option
  EXPECT_LT(static_cast<double>(h.inter_host_all), 0.27 * static_cast<double>(h.inter_host_plain));

  StrategyPlan f = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  EXPECT_EQ(f.inter_host_qgz, -1);
  EXPECT_LT(f.inter_host_hpz, f.inter_host_plain);
  EXPECT_LT(f.inter_host_all, f.inter_host_hpz);
  ps.engine.compression.secondary_shards = true;
  StrategyPlan fh = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  EXPECT_EQ(fh.comm.inter_host, f.inter_host_hpz);  // the deck's choice is what `comm` shows
  int64_t blocks = 0, block_bytes = 0;
  for (const auto& u : f.units)
    if (!u.is_root() && !u.is_ignored()) {
      ++blocks;
      int64_t b = 0;
      for (const auto& fl : u.flats) b += fl.full_bytes();
      block_bytes = std::max(block_bytes, b);
    }
  ASSERT_GE(blocks, 3);
  // At the forward's end every block's secondary shard is held, fewer as backward takes them:
  // the peak grows by at most all of them.
  const int64_t all_secondaries = blocks * (block_bytes / 2);
  EXPECT_GT(fh.mem.total, f.mem.total);
  EXPECT_LE(fh.mem.total - f.mem.total, all_secondaries) << f.mem.peak_at << " / " << fh.mem.peak_at;
}

// Every strategy x ZeRO++ option: the deck reading either keeps the option (the engine runs it:
// test_zeropp, e2e_train_zeropp) or refuses with a UserError naming the key (exit 2).
TEST(DeckSetup, EveryStrategyOptionCombinationRunsOrIsRefusedByName) {
  const std::map<std::string, std::set<std::string>> runs = {
      {"fsdp.quantize_weights", {"full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2"}},
      {"fsdp.quantize_grads", {"hybrid_shard", "hybrid_shard_zero2"}},
      {"fsdp.secondary_shards", {"full_shard"}}};
  for (const auto& [key, ok] : runs)
    for (const char* strat : {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2"})
      for (bool offload : {false, true}) {
        deck::Deck d = deck::Deck::defaults({std::string("parallel.strategy=") + strat, key + "=true",
                                             std::string("fsdp.cpu_offload=") + (offload ? "true" : "false")});
        const bool expect = ok.count(strat) && !offload;
        try {
          fsdp::Compression c = train::compression_from_deck(d, fsdp::parse_strategy(strat));
          EXPECT_TRUE(expect) << key << " with " << strat << (offload ? " + cpu_offload" : "") << " was not refused";
          EXPECT_TRUE(c.quantize_weights || c.quantize_grads || c.secondary_shards);
        } catch (const UserError& e) {
          EXPECT_FALSE(expect) << key << " with " << strat << ": " << e.what();
          EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
        }
      }
}

// ---- the step-time estimate (step_time.h) -----------------------------------------------

namespace {

// The GPT-2 above at a rate where its compute and its communication are of one order: 4 ranks,
// 2 per host, 10 GB/s inside a host, no latency (the byte terms are what these tests vary).
PlanSettings timed(double w, double tflops = 1e-3, int cores = 0) {
  PlanSettings ps = gpt2(4, 2);
  ps.inter_host_weight = w;
  ps.step.compute_tflops = tflops;
  ps.step.intra_busbw_gbps = 10;
  ps.step.latency_us = 0;
  ps.step.cores_per_host = cores;
  return ps;
}

double seconds_of(const PlanSettings& ps, const StrategyPlan& p, plan::CollectiveKind k) {
  double t = 0;
  for (const auto& c : p.collectives)
    if (c.kind == k) t += plan::collective_seconds(ps.step, c) * (k == plan::CollectiveKind::ReplicaAllReduce ? 1 : ps.grad_accum);
  return t;
}

}  // namespace

// The collectives the estimate replays are the ones the byte counts sum: the same bytes, and a
// step's compute is the trainer's MFU count (model::Model::train_flops_per_item) per rank.
TEST(StepTime, CollectivesAreTheCountedBytes) {
  PlanSettings ps = timed(8);
  ps.grad_accum = 2;
  for (fsdp::Strategy st : plan::all_strategies()) {
    const StrategyPlan p = plan::plan_strategy(ps, st);
    double ag = 0, rs = 0, ar = 0;
    for (const auto& c : p.collectives) {
      const double n = c.kind == plan::CollectiveKind::ReplicaAllReduce ? 1 : ps.grad_accum;
      (c.kind == plan::CollectiveKind::ReduceScatter ? rs : c.kind == plan::CollectiveKind::ReplicaAllReduce ? ar : ag) += n * c.bytes;
    }
    EXPECT_NEAR(ag, p.comm.all_gather, 2 + 1e-9 * ag) << fsdp::to_string(st);
    EXPECT_NEAR(rs, p.comm.reduce_scatter, 2 + 1e-9 * rs) << fsdp::to_string(st);
    EXPECT_NEAR(ar, p.comm.all_reduce, 2 + 1e-9 * ar) << fsdp::to_string(st);
  }
  const auto net = model::build_model(ps.spec, at::kMeta);
  const double want = net->train_flops_per_item() * ps.micro_batch * ps.grad_accum * ps.spec.seq_len;
  EXPECT_DOUBLE_EQ(plan::step_flops(ps, false), want);
  EXPECT_GT(plan::step_flops(ps, true), want);  // the blocks' forward again
  EXPECT_LT(plan::step_flops(ps, true), want * 4 / 3 + 1);
  const StrategyPlan fs = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  EXPECT_NEAR(fs.step.compute_s, want / 1e9, 1e-12);
  EXPECT_GT(fs.step_recompute.compute_s, fs.step_no_recompute.compute_s);
}

// no_shard's all-reduce runs after the last backward: nothing hides it, so its exposed time is
// the whole all-reduce and grows with the link's weight; full_shard's prefetched gathers and its
// reduce-scatters run behind compute, so part of its communication is hidden.
TEST(StepTime, NoShardExposesItsAllReduceAndItGrowsWithTheLink) {
  double last = -1;
  for (double w : {1.0, 4.0, 16.0, 64.0}) {
    const PlanSettings ps = timed(w);
    const StrategyPlan ns = plan::plan_strategy(ps, fsdp::Strategy::NoShard);
    EXPECT_FALSE(ns.step.shared_cores);
    EXPECT_NEAR(ns.step.exposed_s, seconds_of(ps, ns, plan::CollectiveKind::ReplicaAllReduce), 1e-12);
    EXPECT_NEAR(ns.step.exposed_s, ns.step.comm_s, 1e-12);
    EXPECT_GT(ns.step.exposed_s, last);
    last = ns.step.exposed_s;
    const StrategyPlan fs = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
    EXPECT_LT(fs.step.exposed_s, fs.step.comm_s) << w;
    EXPECT_GT(fs.step.exposed_s, 0);
    EXPECT_NEAR(fs.step.step_s(), fs.step.compute_s + fs.step.exposed_s, 1e-15);
  }
}

// Forward prefetch issues the next unit's gather before the current unit computes: less of the
// forward's gathers is exposed. Backward prefetch likewise in backward (none: every gather waits).
TEST(StepTime, PrefetchHidesGathers) {
  PlanSettings ps = timed(1);
  const double base = plan::plan_strategy(ps, fsdp::Strategy::FullShard).step.exposed_s;
  ps.engine.forward_prefetch = true;
  EXPECT_LT(plan::plan_strategy(ps, fsdp::Strategy::FullShard).step.exposed_s, base);
  ps.engine.forward_prefetch = false;
  ps.engine.backward_prefetch = fsdp::BackwardPrefetch::None;
  EXPECT_GT(plan::plan_strategy(ps, fsdp::Strategy::FullShard).step.exposed_s, base);
}

// More threads than cores on a host: compute runs at the host's core share, and the core time of
// communication (copies, a TCP stack costing link_cores.weight per link byte, the sync cost) is
// serialised with it: with every link byte core time nothing is hidden; a slower wire's extra
// time overlaps compute again.
TEST(StepTime, AnOversubscribedHostSerialisesCommAndCompute) {
  PlanSettings own_ps = timed(8, 1e-3, 2), shared_ps = timed(8, 1e-3, 1);
  shared_ps.step.link_cores.weight = {8, 8, 8};  // the link is the stack's speed: all core time
  const StrategyPlan own = plan::plan_strategy(own_ps, fsdp::Strategy::FullShard);
  const StrategyPlan shared = plan::plan_strategy(shared_ps, fsdp::Strategy::FullShard);
  EXPECT_FALSE(own.step.shared_cores);
  EXPECT_TRUE(shared.step.shared_cores);
  EXPECT_NEAR(shared.step.compute_s, 2 * own.step.compute_s, 1e-12);  // 2 ranks x 1 thread on 1 core
  EXPECT_NEAR(shared.step.comm_s, own.step.comm_s, 1e-15);
  EXPECT_NEAR(shared.step.comm_core_s, shared.step.comm_s, 1e-15);
  EXPECT_NEAR(shared.step.exposed_s, shared.step.comm_s, 1e-12);
  EXPECT_LT(own.step.exposed_s, own.step.comm_s);
  // A wire 8x slower than the stack (W = 64): the core part is the same, the rest can hide.
  PlanSettings wire = shared_ps;
  wire.inter_host_weight = 64;
  const StrategyPlan slow = plan::plan_strategy(wire, fsdp::Strategy::FullShard);
  EXPECT_NEAR(slow.step.comm_core_s, shared.step.comm_core_s, 1e-12);
  EXPECT_LT(slow.step.exposed_s, slow.step.comm_s);
  EXPECT_GT(slow.step.exposed_s, shared.step.exposed_s);
  // The sync cost: per collective, on shared cores only.
  shared_ps.step.link_cores.sync_us = {1000, 1000, 1000};
  own_ps.step.link_cores.sync_us = {1000, 1000, 1000};
  const StrategyPlan synced = plan::plan_strategy(shared_ps, fsdp::Strategy::FullShard);
  EXPECT_NEAR(synced.step.comm_s - shared.step.comm_s, 1e-3 * synced.collectives.size(), 1e-9);
  EXPECT_NEAR(plan::plan_strategy(own_ps, fsdp::Strategy::FullShard).step.comm_s, own.step.comm_s, 1e-15);
}

// On shared cores each collective costs its sync time: no_shard's one all-reduce against the
// sharded strategies' per-unit collectives. Enough sync cost flips the pick to no_shard.
TEST(StepTime, SyncCostPerCollectiveFavoursFewCollectives) {
  PlanSettings ps = timed(8, 1e-3, 1);
  ps.step.link_cores.weight = {8, 8, 8};
  auto pick = [](const PlanSettings& p) {
    auto plans = plan::plan_all(p);
    bool rc = true;
    return plans[plan::recommend(plans, int64_t(1) << 40, &rc)].strategy;
  };
  EXPECT_NE(pick(ps), fsdp::Strategy::NoShard);
  ps.step.link_cores.sync_us = {1e4, 1e4, 1e4};
  EXPECT_NE(pick(ps), fsdp::Strategy::NoShard);  // the hybrids' per-unit collectives stay inside hosts
  ps.step.intra_cores.sync_us = {1e4, 1e4, 1e4};
  EXPECT_EQ(pick(ps), fsdp::Strategy::NoShard);
}

// Each collective pays the core costs of its ring's kind: full_shard's rings cross the links (4
// ranks, 2 per host), hybrid_shard's shard groups stay inside hosts and its replica pairs cross
// them. Sync and core weight are per op (all-gather, reduce-scatter, all-reduce).
TEST(StepTime, CoreCostsFollowTheRingKindAndOp) {
  const PlanSettings base = timed(8, 1e-3, 1);
  const StrategyPlan fs = plan::plan_strategy(base, fsdp::Strategy::FullShard);
  const StrategyPlan hs = plan::plan_strategy(base, fsdp::Strategy::HybridShard);
  int fs_cross = 0, hs_cross = 0, hs_intra = 0;
  for (const auto& c : fs.collectives) fs_cross += c.crosses_link;
  for (const auto& c : hs.collectives) (c.crosses_link ? hs_cross : hs_intra) += 1;
  EXPECT_EQ(fs_cross, static_cast<int>(fs.collectives.size()));
  EXPECT_EQ(hs_cross, 1);  // the replica all-reduce
  EXPECT_EQ(hs_intra, static_cast<int>(hs.collectives.size()) - 1);
  for (const auto& c : hs.collectives)
    EXPECT_EQ(c.crosses_link, c.kind == plan::CollectiveKind::ReplicaAllReduce) << plan::to_string(c.kind);

  // An intra-host sync cost on the all-gathers only: hybrid_shard pays it per gather, full_shard
  // not at all; a link sync cost on the all-reduce only: hybrid_shard's one replica all-reduce.
  PlanSettings ps = base;
  ps.step.intra_cores.sync_us = {1000, 0, 0};
  int gathers = 0;
  for (const auto& c : hs.collectives)
    gathers += c.kind == plan::CollectiveKind::ForwardGather || c.kind == plan::CollectiveKind::BackwardGather;
  ASSERT_GT(gathers, 0);
  EXPECT_NEAR(plan::plan_strategy(ps, fsdp::Strategy::HybridShard).step.comm_s - hs.step.comm_s, 1e-3 * gathers, 1e-12);
  EXPECT_EQ(plan::plan_strategy(ps, fsdp::Strategy::FullShard).step.comm_s, fs.step.comm_s);
  ps = base;
  ps.step.link_cores.sync_us = {0, 0, 2000};
  EXPECT_NEAR(plan::plan_strategy(ps, fsdp::Strategy::HybridShard).step.comm_s - hs.step.comm_s, 2e-3, 1e-12);
  EXPECT_EQ(plan::plan_strategy(ps, fsdp::Strategy::FullShard).step.comm_s, fs.step.comm_s);

  // The core weight of an intra-host ring (default 1: all of its time is core time): below 1 part
  // of it is waiting on the peer, which overlaps compute; full_shard's estimate does not move.
  EXPECT_NEAR(hs.step.comm_core_s, [&] {
    double core = 0;
    for (const auto& c : hs.collectives)
      core += plan::collective_core_seconds(base.step, c) * (c.kind == plan::CollectiveKind::ReplicaAllReduce ? 1 : base.grad_accum);
    return core;
  }(), 1e-12);
  ps = base;
  ps.step.intra_cores.weight = {0.25, 0.25, 0.25};
  const StrategyPlan light = plan::plan_strategy(ps, fsdp::Strategy::HybridShard);
  EXPECT_LT(light.step.comm_core_s, hs.step.comm_core_s);
  EXPECT_EQ(light.step.comm_s, hs.step.comm_s);
  EXPECT_LE(light.step.step_s(), hs.step.step_s());
  EXPECT_EQ(plan::plan_strategy(ps, fsdp::Strategy::FullShard).step.step_s(), fs.step.step_s());
  for (const auto& c : hs.collectives) {
    if (c.crosses_link) continue;
    const double t = plan::collective_seconds(ps.step, c, true);
    const double lat = ps.step.latency_us * 1e-6 * c.ring_steps;
    EXPECT_NEAR(plan::collective_core_seconds(ps.step, c), 0.25 * (t - lat), 1e-15);
  }
}

// The recommendation is the shortest estimated step among the plans that fit, and it flips where
// the estimate does: with a slow link and cores to spare, a sharded strategy hides its traffic
// behind compute while no_shard's all-reduce is exposed; without compute to hide behind, no_shard
// and shard_grad_op move the same bytes over the same ring and hybrid's quarter-size replica
// all-reduce is the least.
TEST(StepTime, RecommendationFollowsTheEstimate) {
  for (double tflops : {0.0, 1e-4, 1e-3, 1e-2}) {
    for (double w : {1.0, 8.0, 64.0}) {
      const PlanSettings ps = timed(w, tflops);
      auto plans = plan::plan_all(ps);
      bool rc = true;
      const int best = plan::recommend(plans, int64_t(1) << 40, &rc);
      ASSERT_GE(best, 0);
      for (const auto& p : plans) EXPECT_LE(plans[best].step.step_s(), p.step.step_s()) << tflops << " " << w;
    }
  }
  auto pick = [](const PlanSettings& ps) {
    auto plans = plan::plan_all(ps);
    bool rc = true;
    return plans[plan::recommend(plans, int64_t(1) << 40, &rc)].strategy;
  };
  // No compute: communication alone; the least weighted bytes (hybrid_shard_zero2 at W = 8).
  EXPECT_EQ(pick(timed(8, 0)), fsdp::Strategy::HybridShardZero2);
  // Slow compute on dedicated cores: a sharded strategy hides its link traffic, no_shard cannot.
  const PlanSettings slow = timed(8, 1e-5);
  EXPECT_NE(pick(slow), fsdp::Strategy::NoShard);
  const StrategyPlan sgo = plan::plan_strategy(slow, fsdp::Strategy::ShardGradOp);
  const StrategyPlan ns = plan::plan_strategy(slow, fsdp::Strategy::NoShard);
  EXPECT_LT(sgo.step.step_s(), ns.step.step_s());
  // The same on an oversubscribed host whose link bytes are all core time: nothing hides, and
  // no_shard's one all-reduce moves the bytes shard_grad_op moves (same ring): equal.
  PlanSettings shared = timed(8, 1e-5, 1);
  shared.step.link_cores.weight = {8, 8, 8};
  const StrategyPlan sgo1 = plan::plan_strategy(shared, fsdp::Strategy::ShardGradOp);
  const StrategyPlan ns1 = plan::plan_strategy(shared, fsdp::Strategy::NoShard);
  EXPECT_NEAR(sgo1.step.step_s(), ns1.step.step_s(), 1e-9 * ns1.step.step_s());
}

// The optimizer updates each rank's shards: at 4 ranks full_shard's optimizer term is 1/4 of
// no_shard's (up to the padding), and it is compute, added to the step after the last collective.
TEST(StepTime, TheOptimizerUpdatesTheRanksShards) {
  PlanSettings ps = timed(8, 1e-3, 2);
  const StrategyPlan base = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  ps.step.optimizer_ns_per_param = 10;
  const StrategyPlan fs = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  const StrategyPlan ns = plan::plan_strategy(ps, fsdp::Strategy::NoShard);
  EXPECT_EQ(base.step.optimizer_s, 0.0);
  EXPECT_GT(fs.step.optimizer_s, 0.0);
  EXPECT_NEAR(ns.step.optimizer_s / fs.step.optimizer_s, 4.0, 0.05);
  EXPECT_NEAR(fs.step.compute_s - base.step.compute_s, fs.step.optimizer_s, 1e-12);
  EXPECT_NEAR(fs.step.step_s() - base.step.step_s(), fs.step.optimizer_s, 1e-9);
}

// ---- DiLoCo (parallel.replica_sync = "diloco", the [diloco] section) ---------------------

// The hybrids over 2 hosts x 2 ranks (S = 2, R = 2) of the GPT-2 above, fp32, one flat per unit:
// root 64*32 + 16*32 + 2*32 = 2,624 elements, each of the 3 blocks 2*64 (ln_1, ln_2) + 3,168
// (c_attn) + 1,056 (attn c_proj) + 4,224 (c_fc) + 4,128 (mlp c_proj) = 12,704; a rank's shards
// hold half of each: 1,312 + 3 x 6,352 = 20,368 elements (L).
TEST(MemoryPlan, DilocoOuterStateAndBytesPerStep) {
  PlanSettings ps = gpt2(4, 2);
  ps.engine.compression.block = 64;
  ps.engine.compression.guard_every = 0;  // no amortised exact averages in the numbers
  const StrategyPlan every = plan::plan_strategy(ps, fsdp::Strategy::HybridShard);
  const StrategyPlan full = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  ASSERT_EQ(psi(ps), 2624 + 3 * 12704);
  const int64_t L = 1312 + 3 * 6352;
  ASSERT_EQ(every.mem.params, 4 * L);
  // every_step: the replica all-reduce of the fp32 shards, 2(R-1)/R x 4L = 81,472 bytes per
  // rank per step; both replicate rings leave host 0: 162,944 bytes over its link.
  ASSERT_EQ(every.comm.inter_host, 81472);
  ASSERT_EQ(every.comm.inter_host_link, 162944);

  ps.engine.replica_sync.mode = fsdp::ReplicaSyncMode::DiLoCo;
  ps.engine.replica_sync.inner_steps = 100;
  for (fsdp::Strategy st : {fsdp::Strategy::HybridShard, fsdp::Strategy::HybridShardZero2}) {
    const StrategyPlan d = plan::plan_strategy(ps, st);
    const StrategyPlan e = [&] {
      PlanSettings q = ps;
      q.engine.replica_sync.mode = fsdp::ReplicaSyncMode::EveryStep;
      return plan::plan_strategy(q, st);
    }();
    ASSERT_TRUE(d.diloco) << fsdp::to_string(st);
    // Memory: + the outer copy and momentum, 2 x 4 bytes per shard element = 162,944 bytes, at
    // every instant after init (the peak here is in backward).
    EXPECT_EQ(d.mem.outer, 162944);
    EXPECT_EQ(d.mem.state(), e.mem.state() + 162944);
    ASSERT_NE(d.mem.peak_at, "init");
    EXPECT_EQ(d.mem.total, e.mem.total + 162944);
    // fp32 outer sync: one ring all-reduce of the shards per cycle, 81,472 bytes per rank, / H =
    // 814.72 per step; over host 0's link 1,629.44 per step: 1/100 of every_step's.
    EXPECT_DOUBLE_EQ(d.outer.bytes_per_cycle, 81472.0);
    EXPECT_EQ(d.comm.all_reduce, 814);
    EXPECT_EQ(d.comm.inter_host, 814);
    EXPECT_EQ(d.comm.inter_host_link, 1629);
    EXPECT_EQ(d.every_step_link, 162944);
    // Nothing else crosses: the inner steps' gathers and reduce-scatters stay inside the hosts.
    EXPECT_EQ(d.comm.intra_host, e.comm.intra_host);
    for (const auto& c : d.collectives) EXPECT_FALSE(c.crosses_link) << plan::to_string(c.kind);
    EXPECT_EQ(d.inter_host_qgz, -1);  // quantize_grads has no per-step average to quantize
  }
  // The strategies without replicas across hosts sync every step whatever the deck says.
  const StrategyPlan full_dl = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  EXPECT_FALSE(full_dl.diloco);
  EXPECT_EQ(full_dl.mem.total, full.mem.total);
  EXPECT_EQ(full_dl.comm.inter_host_link, full.comm.inter_host_link);

  // int4: per flat an all-gather of R packed vectors, (R-1) = 1 sent: ceil(n/2) code bytes padded
  // to 4, plus 4 bytes per 64 values. Root n = 1,312: 656 + 4 x 21 = 740; block n = 6,352:
  // 3,176 + 4 x 100 = 3,576. A cycle: 740 + 3 x 3,576 = 11,468 bytes per rank; 114.68 per step,
  // 229.36 over host 0's link: 1/710 of every_step's 162,944 (the goal: at most 1/300).
  ps.engine.replica_sync.outer_dtype = fsdp::parse_wire_format("int4");
  const StrategyPlan q = plan::plan_strategy(ps, fsdp::Strategy::HybridShard);
  EXPECT_DOUBLE_EQ(q.outer.bytes_per_cycle, 11468.0);
  EXPECT_EQ(q.comm.inter_host, 114);
  EXPECT_EQ(q.comm.inter_host_link, 229);
  EXPECT_LT(300.0 * q.comm.inter_host_link, static_cast<double>(q.every_step_link));
  EXPECT_EQ(q.mem.outer, 162944);  // the outer state is fp32 whatever the wire format
  // bf16: half of fp32's all-reduce; int8: n codes padded to 4 + the scales (1,312 + 84, 6,352 + 400).
  ps.engine.replica_sync.outer_dtype = fsdp::parse_wire_format("bf16");
  EXPECT_DOUBLE_EQ(plan::plan_strategy(ps, fsdp::Strategy::HybridShard).outer.bytes_per_cycle, 40736.0);
  ps.engine.replica_sync.outer_dtype = fsdp::parse_wire_format("int8");
  EXPECT_DOUBLE_EQ(plan::plan_strategy(ps, fsdp::Strategy::HybridShard).outer.bytes_per_cycle, 1396.0 + 3 * 6752.0);
  // The accuracy guard of a quantized format adds the exact fp32 average at 1 sync in k.
  ps.engine.compression.guard_every = 4;
  EXPECT_DOUBLE_EQ(plan::plan_strategy(ps, fsdp::Strategy::HybridShard).outer.bytes_per_cycle,
                   1396.0 + 3 * 6752.0 + 81472.0 / 4);
  ps.engine.compression.guard_every = 0;

  // The engine keeps the momentum buffer even without outer momentum.
  ps.engine.replica_sync.outer_dtype = fsdp::parse_wire_format("fp32");
  ps.engine.replica_sync.outer_momentum = 0;
  EXPECT_EQ(plan::plan_strategy(ps, fsdp::Strategy::HybridShard).mem.outer, 8 * L);
}

// Streaming: F fragments of consecutive units, each synced once per cycle: the same bytes per
// cycle as one sync of the whole model; more fragments than units is refused naming the key.
TEST(MemoryPlan, DilocoFragmentsCutTheUnits) {
  PlanSettings ps = gpt2(4, 2);
  ps.engine.replica_sync.mode = fsdp::ReplicaSyncMode::DiLoCo;
  ps.engine.replica_sync.inner_steps = 100;
  const StrategyPlan one = plan::plan_strategy(ps, fsdp::Strategy::HybridShard);
  ASSERT_EQ(one.outer.fragments.size(), 1u);
  ps.engine.replica_sync.fragments = 2;
  const StrategyPlan two = plan::plan_strategy(ps, fsdp::Strategy::HybridShard);
  ASSERT_EQ(two.outer.fragments.size(), 2u);
  EXPECT_EQ(two.outer.first_unit, (std::vector<int>{0, 2, 4}));  // root + block 0, blocks 1 and 2
  // 2(R-1)/R x 4 bytes = 4 bytes per shard element at R = 2
  EXPECT_DOUBLE_EQ(two.outer.fragments[0].bytes, 4.0 * (1312 + 6352));
  EXPECT_DOUBLE_EQ(two.outer.fragments[1].bytes, 4.0 * 2 * 6352);
  EXPECT_DOUBLE_EQ(two.outer.bytes_per_cycle, one.outer.bytes_per_cycle);
  EXPECT_EQ(two.comm.inter_host_link, one.comm.inter_host_link);
  // Unit u of U in fragment u * F / U: 4 units in 3 fragments {0, 1}, {2}, {3}.
  ps.engine.replica_sync.fragments = 3;
  const StrategyPlan three = plan::plan_strategy(ps, fsdp::Strategy::HybridShard);
  EXPECT_EQ(three.outer.first_unit, (std::vector<int>{0, 2, 3, 4}));
  EXPECT_DOUBLE_EQ(three.outer.bytes_per_cycle, one.outer.bytes_per_cycle);
  ps.engine.replica_sync.fragments = 5;  // 4 units
  try {
    plan::plan_strategy(ps, fsdp::Strategy::HybridShard);
    ADD_FAILURE() << "5 fragments of 4 units were not refused";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("diloco.fragments"), std::string::npos) << e.what();
  }
}

// The step: the inner step has no replica all-reduce; the outer sync's time / H is added, exposed
// whole without overlap, hidden behind overlap_steps inner steps' compute with it.
TEST(StepTime, DilocoAmortisesTheOuterSyncOverH) {
  PlanSettings ps = timed(8);  // 10 GB/s inside a host, no latency; the replica rings: 2 edges, W_2 = 16
  const StrategyPlan every = plan::plan_strategy(ps, fsdp::Strategy::HybridShard);
  ps.engine.replica_sync.mode = fsdp::ReplicaSyncMode::DiLoCo;
  ps.engine.replica_sync.inner_steps = 100;
  const StrategyPlan d = plan::plan_strategy(ps, fsdp::Strategy::HybridShard);
  // The cycle's sync: 81,472 bytes x 16 / 1e10 B/s = 130.3552 us; 1.303552 us per step.
  const double sync = 81472.0 * 16 / 1e10;
  EXPECT_NEAR(d.step.outer_comm_s, sync / 100, 1e-12);
  EXPECT_NEAR(d.step.outer_exposed_s, sync / 100, 1e-12);
  // every_step's replica all-reduce (the same bytes, every step, after the last backward) is gone.
  double replica = 0;
  for (const auto& c : every.collectives)
    if (c.kind == plan::CollectiveKind::ReplicaAllReduce) replica += plan::collective_seconds(ps.step, c);
  EXPECT_NEAR(replica, sync, 1e-12);
  EXPECT_NEAR(d.step.inner_step_s(), every.step.step_s() - sync, 1e-9);
  EXPECT_NEAR(d.step.step_s(), d.step.inner_step_s() + sync / 100, 1e-12);
  // Overlapped with one inner step, whose compute is longer than the sync: nothing exposed.
  ASSERT_GT(d.step.compute_s, sync);
  ps.engine.replica_sync.overlap_steps = 1;
  const StrategyPlan o = plan::plan_strategy(ps, fsdp::Strategy::HybridShard);
  EXPECT_NEAR(o.step.outer_comm_s, sync / 100, 1e-12);
  EXPECT_EQ(o.step.outer_exposed_s, 0.0);
  EXPECT_NEAR(o.step.step_s(), d.step.inner_step_s(), 1e-12);
  // On a slow link (W = 8000: the sync now outlasts a step's compute) only the excess shows.
  ps.inter_host_weight = 8000;
  const StrategyPlan slow = plan::plan_strategy(ps, fsdp::Strategy::HybridShard);
  const double t = 81472.0 * 16000 / 1e10;
  ASSERT_GT(t, slow.step.compute_s);
  EXPECT_NEAR(slow.step.outer_exposed_s, (t - slow.step.compute_s) / 100, 1e-12);
}

// The deck's [diloco] keys reach the planner (parallel.replica_sync itself is refused by the deck
// until the engine runs DiLoCo, so only the section is read here).
TEST(DeckSetup, DilocoKeysReachThePlanner) {
  deck::Deck d = deck::Deck::defaults({"diloco.inner_steps=50", "diloco.fragments=2", "diloco.overlap_steps=3",
                                       "diloco.outer_dtype=int4", "diloco.outer_lr=0.5", "diloco.outer_momentum=0.8",
                                       "diloco.nesterov=false"});
  const PlanSettings ps = train::plan_settings_from_deck(d, 4, 2);
  EXPECT_FALSE(ps.engine.replica_sync.diloco());  // replica_sync = every_step
  EXPECT_EQ(ps.engine.replica_sync.inner_steps, 50);
  EXPECT_EQ(ps.engine.replica_sync.fragments, 2);
  EXPECT_EQ(ps.engine.replica_sync.overlap_steps, 3);
  EXPECT_EQ(ps.engine.replica_sync.outer_dtype, fsdp::WireFormat::Int4);
  EXPECT_DOUBLE_EQ(ps.engine.replica_sync.outer_lr, 0.5);
  EXPECT_DOUBLE_EQ(ps.engine.replica_sync.outer_momentum, 0.8);
  EXPECT_FALSE(ps.engine.replica_sync.nesterov);
}

// ---- frozen parameters and LoRA (issue 37) ------------------------------------------------------

namespace {
// An fp32 Llama (d = 64, f = 192, 4 heads, T = 32): LoRA of rank r on every linear of the blocks.
PlanSettings llama(int ranks, int64_t lora_rank, std::vector<std::string> targets = {"all-linear"}) {
  PlanSettings ps;
  model::ModelSpec s;
  s.arch = "llama";
  s.vocab_size = 128;
  s.seq_len = 32;
  s.d_model = 64;
  s.n_layers = 3;
  s.n_heads = 4;
  s.tie_embeddings = false;
  s.finetune.lora.rank = lora_rank;
  s.finetune.lora.targets = std::move(targets);
  ps.spec = model::resolve_spec(s);
  ps.engine.wrap_types = {"LlamaDecoderLayer"};
  ps.engine.mp.keep_fp32 = {"norm"};
  ps.micro_batch = 2;
  ps.ranks = ranks;
  ps.ranks_per_host = ranks;
  return ps;
}

int64_t trainable_params(const model::ModelSpec& s) {
  return model::trainable_parameter_count(*model::build_model(s, at::kMeta));
}
}  // namespace

// A frozen flat keeps its shard in the compute dtype and nothing else: the trainable state is
// 16 bytes per trainable element, the frozen shards 2 per frozen element in bf16.
TEST(FrozenPlan, StateIsTheTrainableFlatsOnly) {
  PlanSettings ps = llama(2, 8);
  ps.engine.mp.param_dtype = at::kBFloat16;
  const StrategyPlan p = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  int64_t trains = 0, frozen_bytes = 0;
  for (const auto& u : p.units)
    for (const auto& f : u.flats) {
      if (f.frozen) frozen_bytes += f.shard_numel * f.elem_bytes();
      else trains += f.shard_numel;
    }
  ASSERT_GT(trains, 0);
  EXPECT_GE(2 * trains, trainable_params(ps.spec));  // every trainable parameter, padded
  EXPECT_EQ(p.mem.params, 4 * trains);
  EXPECT_EQ(p.mem.grads, 4 * trains);
  EXPECT_EQ(p.mem.optim, 8 * trains);
  EXPECT_EQ(p.mem.frozen, frozen_bytes);
  EXPECT_EQ(p.mem.state(), 16 * trains + frozen_bytes);
  // The same model fully trained: 16 bytes per element of everything.
  PlanSettings full = ps;
  full.spec.finetune = {};
  const StrategyPlan f = plan::plan_strategy(full, fsdp::Strategy::FullShard);
  EXPECT_EQ(f.mem.frozen, 0);
  EXPECT_GT(f.mem.params, p.mem.params);
}

// Gradient buffers and reduce-scatters are the trainable flats' only; frozen flats are gathered.
TEST(FrozenPlan, GradientBuffersAndReductionsOfTrainableFlatsOnly) {
  PlanSettings ps = llama(4, 8);
  const StrategyPlan p = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  PlanSettings full = ps;
  full.spec.finetune = {};
  const StrategyPlan f = plan::plan_strategy(full, fsdp::Strategy::FullShard);
  int64_t lora_block = 0, rs = 0, ag = 0;
  for (const auto& u : p.units)
    for (const auto& fl : u.flats) {
      if (!u.is_root() && !fl.frozen) lora_block = std::max(lora_block, fl.full_bytes());
      const double gathers = u.is_root() ? 1 : 2;
      ag += static_cast<int64_t>(gathers * 3 * fl.padded * fl.elem_bytes() / 4);
      if (!fl.frozen) rs += 3 * fl.padded * 4 / 4;
    }
  // The root has nothing that trains: at the last block's backward one block's LoRA buffer.
  ASSERT_EQ(p.mem_no_recompute.peak_at, "last block backward");
  EXPECT_EQ(p.mem_no_recompute.grad_buffers, lora_block);
  EXPECT_LT(p.mem_no_recompute.grad_buffers, f.mem_no_recompute.grad_buffers);
  EXPECT_NEAR(p.comm.reduce_scatter, rs, 64);
  EXPECT_NEAR(p.comm.all_gather, ag, 64);
  EXPECT_LT(p.comm.reduce_scatter, f.comm.reduce_scatter);
  EXPECT_GT(p.comm.all_gather, f.comm.all_gather);  // the base is still gathered, and the adapters
}

// What LoRA changes in a block (fp32, counted with the allocator: docs/memory-planner.md): the
// norms' weights are frozen, so neither saves its normalised tensor (4nd each); each of the
// seven targets saves A x [n, r]; the first block's input (a frozen embedding's output) needs no
// gradient, so its first norm saves nothing (x^2 4nd, rsqrt 4n).
TEST(FrozenPlan, LoraBlockSavesItsLowRankInputs) {
  const int64_t n = 64, d = 64, r = 8;
  fsdp::MixedPrecision mp;
  const plan::ActivationBytes full = plan::activation_bytes(llama(1, 0).spec, mp, 2);
  const plan::ActivationBytes lora = plan::activation_bytes(llama(1, r).spec, mp, 2);
  ASSERT_EQ(lora.blocks.size(), 3u);
  EXPECT_EQ(lora.blocks[1].saved, full.blocks[1].saved - 2 * 4 * n * d + 7 * 4 * n * r);
  EXPECT_EQ(lora.blocks[2].saved, lora.blocks[1].saved);
  EXPECT_EQ(lora.blocks[0].saved, lora.blocks[1].saved - (4 * n * d + 4 * n));
  EXPECT_TRUE(lora.blocks[0].backward);
  // The head and the embedding are frozen: no weight gradient, no embedding gradient.
  EXPECT_EQ(lora.embed_bwd, 0);
  EXPECT_EQ(full.head_bwd_mm - lora.head_bwd_mm, 4 * 128 * d);
}

// A frozen down_proj saves no input for its weight gradient, so the SwiGLU product is not saved,
// and its [d, f] weight gradient does not exist: the MLP's backward peaks in the product's
// backward (its gradient and the two it makes: 3 x 4nf).
TEST(FrozenPlan, FrozenLinearHasNoWeightGradient) {
  const int64_t n = 64, f = 192;
  fsdp::MixedPrecision mp;
  PlanSettings ps = llama(1, 0);
  const plan::ActivationBytes full = plan::activation_bytes(ps.spec, mp, 2);
  ps.spec.finetune.freeze = {"mlp.down_proj"};
  const plan::ActivationBytes frz = plan::activation_bytes(ps.spec, mp, 2);
  EXPECT_EQ(full.blocks[1].saved - frz.blocks[1].saved, 4 * n * f);
  EXPECT_EQ(frz.blocks[1].bwd_work, 3 * 4 * n * f);
  EXPECT_EQ(full.blocks[1].bwd_work, 2 * 4 * n * f);
}

// Freezing the embedding and the lower blocks: backward stops above them, they save nothing.
TEST(FrozenPlan, BackwardStopsAboveTheFrozenLayers) {
  fsdp::MixedPrecision mp;
  PlanSettings ps = llama(1, 0);
  ps.spec.finetune.freeze = {"model.embed_tokens.*", "model.layers.0.*"};
  const plan::ActivationBytes a = plan::activation_bytes(ps.spec, mp, 2);
  EXPECT_FALSE(a.blocks[0].backward);
  EXPECT_EQ(a.blocks[0].saved, 0);
  EXPECT_TRUE(a.blocks[1].backward);
  EXPECT_FALSE(a.embedding_trains);
  const StrategyPlan p = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  EXPECT_GT(p.mem.frozen, 0);
}

// MFU: forward 2N and the input gradient 2N for every weight, the weight gradient 2N only for the
// trainable ones (LoRA's adapters: 6 N_lora); attention unchanged.
TEST(FrozenPlan, FlopsCountWeightGradientsOfTrainableWeightsOnly) {
  PlanSettings full = llama(1, 0), lora = llama(1, 8);
  const auto net_full = model::build_model(full.spec, at::kMeta), net_lora = model::build_model(lora.spec, at::kMeta);
  const int64_t base = model::parameter_count(full.spec) - 128 * 64;  // the untied embedding is a lookup
  const int64_t adapters = model::trainable_parameter_count(*net_lora);
  ASSERT_EQ(adapters, 3 * 8 * ((64 + 64) * 4 + (64 + 192) * 3));  // q, k, v, o; gate, up, down
  const double attn = net_full->train_flops_per_token(32) - 6.0 * static_cast<double>(base);
  EXPECT_DOUBLE_EQ(net_lora->train_flops_per_token(32), 4.0 * base + 6.0 * adapters + attn);
  EXPECT_DOUBLE_EQ(plan::step_flops(lora, false), net_lora->train_flops_per_item() * lora.micro_batch * 32);
}

// With cpu_offload the state, frozen shards included, is host memory: per rank the state and the
// staging of the gradient copies; per host ranks_per_host times that.
TEST(FrozenPlan, CpuOffloadStatesItsHostMemory) {
  PlanSettings ps = llama(2, 8);
  ps.engine.mp.param_dtype = at::kBFloat16;
  ps.engine.cpu_offload = true;
  const StrategyPlan p = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  int64_t max_shard = 0;
  for (const auto& u : p.units)
    for (const auto& f : u.flats)
      if (!f.frozen) max_shard = std::max(max_shard, f.shard_numel);
  EXPECT_EQ(p.mem.host, p.mem.state() + static_cast<int64_t>(fsdp::kMaxPendingCopies) * 4 * max_shard);
  EXPECT_GT(p.mem.frozen, 0);
  const std::string text = plan::format_plan(ps, {p}, int64_t{1} << 30);
  EXPECT_NE(text.find("host memory / rank"), std::string::npos);
  EXPECT_NE(text.find("host memory / host"), std::string::npos);
  EXPECT_NE(text.find("frozen shards (bf16)"), std::string::npos);
  PlanSettings resident = ps;
  resident.engine.cpu_offload = false;
  EXPECT_EQ(plan::plan_strategy(resident, fsdp::Strategy::FullShard).mem.host, 0);
}

// On CUDA with the fused kernels no T x T score matrix is saved: a block's activations grow
// linearly with the sequence, where the explicit form's grow with its square.
TEST(FrozenPlan, FusedAttentionKeepsNoScores) {
  fsdp::MixedPrecision mp;
  mp.param_dtype = at::kBFloat16;
  mp.keep_fp32 = {"norm"};
  plan::Target cuda;
  cuda.cuda = cuda.fused_attention = true;
  PlanSettings ps = llama(1, 0);
  auto at_len = [&](int64_t T, const plan::Target& t) {
    PlanSettings q = ps;
    q.spec.seq_len = T;
    return plan::activation_bytes(q.spec, mp, 2, 1, t).blocks[1];
  };
  // Affine in T (the constant: the norms' bf16 copies of their fp32 weights): f(4T) - f(2T) =
  // 2 (f(2T) - f(T)); the explicit form grows faster.
  const plan::BlockBytes f0 = at_len(128, cuda), f1 = at_len(256, cuda), f2 = at_len(512, cuda);
  EXPECT_EQ(f2.saved - f1.saved, 2 * (f1.saved - f0.saved));
  EXPECT_EQ(f2.bwd_work - f1.bwd_work, 2 * (f1.bwd_work - f0.bwd_work));
  const plan::BlockBytes e0 = at_len(128, {}), e1 = at_len(256, {}), e2 = at_len(512, {});
  EXPECT_GT(e2.saved - e1.saved, 2 * (e1.saved - e0.saved));
  // The explicit form's extra is the fp32 softmax output, its bf16 copy and the causal mask;
  // the fused kernels keep the fp32 logsumexp per head and row instead.
  const int64_t B = 2, H = 4, T = 256;
  EXPECT_EQ(e1.saved - f1.saved, (4 + 2) * B * H * T * T + T * T - 4 * B * H * T);
}

// Nothing fits: the recommendation plans what would (cpu_offload with its host memory, LoRA of a
// given rank, more ranks), not a fixed list.
TEST(FrozenPlan, WhatWouldFitIsPlanned) {
  PlanSettings ps = llama(2, 0);
  ps.engine.mp.param_dtype = at::kBFloat16;
  ps.engine.mp.reduce_dtype = at::kBFloat16;
  // Below every strategy's peak for the full fine-tune, above the LoRA plan's.
  std::vector<StrategyPlan> plans = plan::plan_all(ps);
  int64_t least = plans.front().mem_recompute.total;
  for (const auto& p : plans) least = std::min(least, p.mem_recompute.total);
  const int64_t device = least - 1;
  PlanSettings with_lora = ps;
  with_lora.spec.finetune.lora.rank = plan::kLoraRank;
  with_lora.spec.finetune.lora.targets = {"all-linear"};
  ASSERT_LT(plan::plan_strategy(with_lora, fsdp::Strategy::FullShard).mem_recompute.total, device);
  bool rc = false;
  ASSERT_LT(plan::recommend(plans, device, &rc), 0);
  const std::vector<plan::Alternative> alts = plan::alternatives(ps, device);
  auto find = [&](const std::string& prefix) -> const plan::Alternative* {
    for (const auto& a : alts)
      if (a.change.rfind(prefix, 0) == 0) return &a;
    return nullptr;
  };
  const plan::Alternative* off = find("fsdp.cpu_offload = true");
  ASSERT_NE(off, nullptr);
  EXPECT_TRUE(off->fits);
  EXPECT_GT(off->mem().host, 0);
  const plan::Alternative* lo = find("lora.rank = 16");
  ASSERT_NE(lo, nullptr);
  EXPECT_TRUE(lo->fits);
  EXPECT_TRUE(lo->plan.mem.frozen > 0);
  const plan::Alternative* more = find("--ranks ");
  ASSERT_NE(more, nullptr);
  EXPECT_GT(more->ranks, ps.ranks);
  EXPECT_EQ(more->fits, more->mem().total <= device);
  const std::string text = plan::format_plan(ps, plans, device);
  EXPECT_NE(text.find("fsdp.cpu_offload = true: "), std::string::npos);
  EXPECT_NE(text.find("host memory"), std::string::npos);
  EXPECT_NE(text.find("lora.rank = 16"), std::string::npos);
  EXPECT_EQ(find("fsdp.param_dtype"), nullptr);  // the deck is bf16 already
}

// ---- QLoRA: the base's linear weights as NF4 shards (issue 38) ----------------------------------

namespace {
// A bf16 Llama whose blocks' linear weights are multiples of the double quantization's alignment
// (64 x 256 = 16384 elements: q, k, v, o 128 x 128, gate, up, down 128 x 512), so that NF4 adds
// no padding at 2 or 4 ranks; LoRA of rank 8 on every linear of the blocks.
PlanSettings llama_nf4(int ranks, bool double_quant = true) {
  PlanSettings ps = llama(ranks, 8);
  ps.spec.d_model = 128;
  ps.spec.d_ff = 512;
  ps.spec.n_heads = 4;
  ps.spec = model::resolve_spec(ps.spec);
  ps.engine.mp.param_dtype = at::kBFloat16;
  ps.engine.mp.reduce_dtype = at::kBFloat16;
  return plan::with_nf4_base(ps, 64, double_quant);
}

PlanSettings without_nf4(PlanSettings ps) {
  ps.spec.finetune.lora.nf4_block = 0;
  ps.spec.finetune.lora.nf4_double_quant = false;
  ps.engine.nf4 = {};
  return ps;
}

// nf4_shard.h's layout: L / 2 bytes of codes, then the statistics.
int64_t nf4_bytes(int64_t L, int64_t block, bool dq) {
  return L / 2 + (dq ? L / block + 2 * 4 * (L / (block * 256)) : 4 * (L / block));
}
}  // namespace

// The blocks' frozen linear weights are one NF4 flat per block; its shard is codes and
// statistics (nf4_shard.h), counted at those bytes in the state (frozen_nf4, part of frozen),
// never as shard_numel x the compute dtype; the rest of the frozen base stays bf16.
TEST(Nf4Plan, ShardsAreCodesAndStatistics) {
  for (const bool dq : {true, false}) {
    SCOPED_TRACE(dq ? "double quantization" : "fp32 absmax");
    const PlanSettings ps = llama_nf4(2, dq);
    ASSERT_EQ(ps.engine.nf4.params.size(), 3u * 7u);  // seven linears in each of 3 blocks
    const StrategyPlan p = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
    int64_t nf4 = 0, bf16 = 0, flats = 0;
    for (const auto& u : p.units)
      for (const auto& f : u.flats) {
        if (!f.nf4) {
          if (f.frozen) bf16 += f.shard_numel * f.elem_bytes();
          continue;
        }
        ++flats;
        EXPECT_FALSE(u.is_root());
        EXPECT_TRUE(f.frozen);
        EXPECT_FALSE(f.aliases_master);
        EXPECT_EQ(f.padded % (2 * f.nf4_format.align()), 0);
        EXPECT_EQ(f.shard_bytes(), nf4_bytes(f.shard_numel, 64, dq));
        nf4 += f.shard_bytes();
      }
    EXPECT_EQ(flats, 3);
    EXPECT_EQ(p.mem.frozen_nf4, nf4);
    EXPECT_EQ(p.mem.frozen, nf4 + bf16);
    // Against the same LoRA with its base in bf16: 0.5 + 1/64 + 8/16384 (0.516) or 0.5 + 4/64
    // (0.5625) bytes per weight instead of 2.
    const StrategyPlan b = plan::plan_strategy(without_nf4(ps), fsdp::Strategy::FullShard);
    EXPECT_EQ(b.mem.frozen_nf4, 0);
    const double weights = 3.0 * (4 * 128 * 128 + 3 * 128 * 512) / 2;  // per rank
    EXPECT_DOUBLE_EQ(static_cast<double>(b.mem.frozen - bf16), 2 * weights);
    EXPECT_DOUBLE_EQ(static_cast<double>(nf4) / weights, dq ? 0.5 + 1.0 / 64 + 8.0 / 16384 : 0.5 + 4.0 / 64);
    EXPECT_EQ(p.mem.params, b.mem.params);  // the adapters' state does not change
    const std::string text = plan::format_plan(ps, {p}, int64_t{1} << 30);
    EXPECT_NE(text.find("model.layers.0 (nf4)"), std::string::npos);
    EXPECT_NE(text.find("frozen shards (NF4)"), std::string::npos);
    EXPECT_NE(text.find("frozen shards (bf16)"), std::string::npos);
    EXPECT_NE(text.find("as NF4 (QLoRA: blocks of 64"), std::string::npos);
  }
}

// An NF4 gather holds a wire buffer of S x shard_bytes (every rank's packed shard) until it is
// waited for and dequantized: at a block's backward the block prefetched below it is in flight,
// and before it, the block's own gather is dequantized, one slice at a time, with its wire and
// the dequantization's temporaries (nf4_dequant_bytes, the engine's dequant_temp_bytes) instead of the block's working memory.
// With shard_grad_op (nothing gathered in backward) there is none; on one rank nothing is sent
// (no wire), the shard is dequantized in place.
TEST(Nf4Plan, WireBufferAndDequantizationOfTheGathers) {
  PlanSettings ps = llama_nf4(2);
  ASSERT_EQ(ps.engine.backward_prefetch, fsdp::BackwardPrefetch::Pre);
  const StrategyPlan p = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  int64_t wire = 0, deq = 0;
  for (const auto& f : p.units[1].flats)
    if (f.nf4) {
      wire = 2 * f.shard_bytes();
      deq = plan::nf4_dequant_bytes(f.shard_numel, f.nf4_format, /*cuda=*/false);
      // On CUDA a chunk's int64 byte indices, levels and products besides (12 bytes per value).
      EXPECT_EQ(plan::nf4_dequant_bytes(f.shard_numel, f.nf4_format, true), deq + 12 * f.shard_numel);
    }
  ASSERT_GT(wire, 0);
  EXPECT_EQ(deq, 20 * (131072 / 64));  // L = (4 x 128 x 128 + 3 x 128 x 512) / 2: the CPU's absmax temporaries
  for (const plan::MemoryBreakdown* m : {&p.mem_no_recompute, &p.mem_recompute}) {
    ASSERT_NE(m->peak_at.find("backward"), std::string::npos);
    EXPECT_EQ(m->nf4_wire, wire);
    EXPECT_EQ(m->total, m->state() + m->unsharded + m->nf4_wire + m->grad_buffers + m->activations);
  }
  // The dequantization instant holds the temporaries in place of the block's working memory.
  if (p.mem_no_recompute.peak_at.find("NF4 dequantization") != std::string::npos) {
    EXPECT_GE(p.mem_no_recompute.activations, deq);
  }
  // Without prefetch no gather is in flight during a block's backward: only the dequantization
  // instant holds a wire.
  PlanSettings np = ps;
  np.engine.backward_prefetch = fsdp::BackwardPrefetch::None;
  const StrategyPlan n = plan::plan_strategy(np, fsdp::Strategy::FullShard);
  EXPECT_EQ(n.mem_no_recompute.nf4_wire, n.mem_no_recompute.peak_at.find("NF4 dequantization") != std::string::npos ? wire : 0);
  EXPECT_LT(n.mem_no_recompute.total, p.mem_no_recompute.total);
  EXPECT_EQ(plan::plan_strategy(ps, fsdp::Strategy::ShardGradOp).mem.nf4_wire, 0);
  EXPECT_EQ(plan::plan_strategy(ps, fsdp::Strategy::ShardGradOp).mem.peak_at.find("NF4"), std::string::npos);
  const StrategyPlan one = plan::plan_strategy(llama_nf4(1), fsdp::Strategy::FullShard);
  EXPECT_EQ(one.mem.nf4_wire, 0);
  const std::string text = plan::format_plan(ps, {p}, int64_t{1} << 30);
  EXPECT_NE(text.find("NF4 gathers in flight"), std::string::npos);
}

// The NF4 flats' all-gathers move codes and statistics: (S - 1) x shard_bytes per rank and
// gather, twice per block under full_shard; at 4 ranks with double quantization the frozen
// base's all-gather bytes are 0.258 of its bf16 ones (<= 0.27). The step estimate replays the
// same collectives, so its all-gather time shrinks with them.
TEST(Nf4Plan, GathersMoveCodes) {
  const PlanSettings q = llama_nf4(4);
  const PlanSettings b = without_nf4(q);
  const StrategyPlan pq = plan::plan_strategy(q, fsdp::Strategy::FullShard);
  const StrategyPlan pb = plan::plan_strategy(b, fsdp::Strategy::FullShard);
  double nf4 = 0, base_bf16 = 0;
  for (const auto& u : pq.units)
    for (const auto& f : u.flats)
      if (f.nf4) nf4 += 2 * 3.0 * f.shard_bytes();  // two gathers, (S - 1) packed shards
  for (const auto& u : pb.units)
    for (const auto& f : u.flats)
      if (!u.is_root() && f.frozen && f.dtype == at::kBFloat16) base_bf16 += 2 * 3.0 / 4 * f.padded * f.elem_bytes();
  ASSERT_GT(nf4, 0);
  EXPECT_NEAR(static_cast<double>(pb.comm.all_gather - pq.comm.all_gather), base_bf16 - nf4, 4);
  EXPECT_LE(nf4 / base_bf16, 0.27);
  EXPECT_NEAR(nf4 / base_bf16, (0.5 + 1.0 / 64 + 8.0 / 16384) / 2, 1e-9);
  EXPECT_EQ(pq.comm.reduce_scatter, pb.comm.reduce_scatter);  // frozen: never reduced
  double gathered = 0;
  for (const auto& c : pq.collectives)
    if (c.kind == plan::CollectiveKind::ForwardGather || c.kind == plan::CollectiveKind::BackwardGather)
      gathered += c.bytes;
  EXPECT_NEAR(gathered, static_cast<double>(pq.comm.all_gather), 4);
  EXPECT_LT(pq.step.comm_s, pb.step.comm_s);
  // quantize_weights does not touch an NF4 flat (the engine gathers its codes as they are), and
  // hpZ keeps no secondary shard of it: with both, the NF4 bytes stay.
  PlanSettings zq = q, zb = b;
  for (PlanSettings* z : {&zq, &zb}) {
    z->ranks_per_host = 2;
    z->engine.compression.quantize_weights = true;
    z->engine.compression.secondary_shards = true;
  }
  const StrategyPlan hq = plan::plan_strategy(zq, fsdp::Strategy::FullShard);
  const StrategyPlan hb = plan::plan_strategy(zb, fsdp::Strategy::FullShard);
  EXPECT_LT(hq.comm.all_gather, hb.comm.all_gather);
  EXPECT_LT(hq.mem_no_recompute.unsharded - hb.mem_no_recompute.unsharded, 0);  // no secondary shard of the NF4 flats
}

// With cpu_offload the NF4 shards are host memory (the engine keeps packed() on the host): the
// host counts them at their bytes, the device peak none of the state.
TEST(Nf4Plan, CpuOffloadKeepsTheCodesOnTheHost) {
  PlanSettings ps = llama_nf4(2);
  ps.engine.cpu_offload = true;
  const StrategyPlan p = plan::plan_strategy(ps, fsdp::Strategy::FullShard);
  PlanSettings b = without_nf4(ps);
  const StrategyPlan pb = plan::plan_strategy(b, fsdp::Strategy::FullShard);
  EXPECT_GT(p.mem.frozen_nf4, 0);
  EXPECT_EQ(pb.mem.host - p.mem.host, pb.mem.frozen - p.mem.frozen);
  EXPECT_EQ(p.mem.host - pb.mem.host, p.mem.frozen - pb.mem.frozen);
  // On the device no state: buffers, the wire and activations.
  EXPECT_TRUE(p.mem.state_on_host);
  EXPECT_EQ(p.mem.total, p.mem.unsharded + p.mem.nf4_wire + p.mem.grad_buffers + p.mem.activations);
  EXPECT_GT(p.mem.nf4_wire, 0);
}

// Nothing fits a LoRA deck with its base in bf16 on these ranks: QLoRA is planned, and named with
// its --set keys when it is the only change on these ranks that keeps the state on the device;
// a full fine-tune gets LoRA + NF4. A deck already in NF4 gets no QLoRA line.
TEST(Nf4Plan, RecommendationNamesQlora) {
  PlanSettings q = llama_nf4(2);
  q.micro_batch = 1;  // no smaller micro-batch to plan
  const PlanSettings b = without_nf4(q);
  auto least = [](const PlanSettings& s) {
    int64_t m = INT64_MAX;
    for (const auto& p : plan::plan_all(s)) m = std::min(m, p.mem_recompute.total);
    return m;
  };
  const int64_t lq = least(q), lb = least(b);
  ASSERT_LT(lq, lb);
  const int64_t device = (lq + lb) / 2;
  const std::vector<plan::Alternative> alts = plan::alternatives(b, device);
  const plan::Alternative* qa = nullptr;
  for (const auto& a : alts)
    if (a.qlora && a.ranks == 2 && !a.mem().state_on_host) qa = &a;
  ASSERT_NE(qa, nullptr);
  EXPECT_TRUE(qa->fits);
  EXPECT_EQ(qa->set, "--set lora.base_dtype=nf4 --set lora.nf4_double_quant=true");
  EXPECT_GT(qa->plan.mem.frozen_nf4, 0);
  EXPECT_EQ(plan::only_qlora_fits(alts, 2), qa);
  const std::string text = plan::format_plan(b, plan::plan_all(b), device);
  EXPECT_NE(text.find("nothing fits"), std::string::npos);
  EXPECT_NE(text.find("recommendation: QLoRA, the only change planned above that fits 2 ranks"), std::string::npos)
      << text;
  EXPECT_NE(text.find("--set lora.base_dtype=nf4 --set lora.nf4_double_quant=true --set parallel.strategy="),
            std::string::npos);
  // A full fine-tune: LoRA of rank 16 with its base in NF4 among the alternatives.
  PlanSettings full = b;
  full.spec.finetune = {};
  bool lora_nf4 = false;
  for (const auto& a : plan::alternatives(full, 1))
    lora_nf4 = lora_nf4 || (a.qlora && a.set.rfind("--set lora.rank=16 --set lora.targets=all-linear --set lora.base_dtype=nf4", 0) == 0);
  EXPECT_TRUE(lora_nf4);
  // Already QLoRA: nothing to name.
  for (const auto& a : plan::alternatives(q, 1)) EXPECT_FALSE(a.qlora) << a.change;
  // When a change without NF4 fits too (LoRA's base in bf16 on a bigger device), QLoRA is not named.
  EXPECT_EQ(plan::only_qlora_fits(plan::alternatives(full, int64_t{1} << 40), 2), nullptr);
}
