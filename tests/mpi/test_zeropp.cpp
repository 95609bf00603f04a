// ZeRO++-style quantized collectives (fsdp.quantize_weights / quantize_grads): the block-int8
// round trip bound, the quantized weight gather against the exact one, the error-feedback
// invariant of the quantized replica average (what was sent plus the residuals equals the
// true sum), the accuracy guard's fallback (then bit-identical to the unquantized run), and the
// byte counters (inter-node bytes fall, intra-node traffic stays).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <memory>

#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/quantize.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/fsdp/strategy_comms.h"
#include "shardtrain/runtime/topology.h"
#include "tiny_transformer.h"

using namespace shardtrain;

namespace {

int world_rank() { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
int world_size() { int n; MPI_Comm_size(MPI_COMM_WORLD, &n); return n; }

// ---- quantize.h ----------------------------------------------------------------------

TEST(Quantize, RoundTripWithinHalfAStepOfEachBlock) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  for (int64_t block : {8, 64, 256}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4099}}) {
      at::Tensor x = at::normal(0.0, 1.0, {n}, gen).to(at::kFloat);
      if (n > 10) {
        x[3] = 250.0f;               // an outlier: its block's step is large, the others' are not
        x.narrow(0, n - 5, 5).zero_();  // part of an all-zero tail
      }
      at::Tensor packed = at::empty({fsdp::quantized_bytes(n, block)}, at::kByte);
      ASSERT_EQ(packed.numel() % 4, 0);
      ASSERT_EQ(packed.numel(), (n + 3) / 4 * 4 + 4 * ((n + block - 1) / block));
      fsdp::quantize_into(x, packed, block);
      at::Tensor y = fsdp::dequantize(packed, n, block);
      at::Tensor scales = fsdp::packed_scales(packed, n, block);
      const int64_t nb = (n + block - 1) / block;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t lo = b * block, len = std::min(block, n - lo);
        const float amax = x.narrow(0, lo, len).abs().max().item<float>();
        const float s = scales[b].item<float>();
        EXPECT_FLOAT_EQ(s, amax / 127.0f) << "block " << b;
        const float err = (x.narrow(0, lo, len) - y.narrow(0, lo, len)).abs().max().item<float>();
        // Half a step, plus the fp32 rounding of code * scale.
        EXPECT_LE(err, s / 2 * (1 + 1e-5f) + 1e-30f) << "n " << n << " block " << block << " b " << b;
        // The block's largest value is exact up to rounding: its code is +-127.
        if (amax > 0) {
          EXPECT_NEAR(y.narrow(0, lo, len).abs().max().item<float>(), amax, amax * 1e-6f);
        }
      }
      if (n > 10) {
        EXPECT_TRUE(at::equal(y.narrow(0, n - 5, 5), at::zeros({5})));
      }
      // Into a bf16 buffer: the fp32 dequantization, cast once.
      at::Tensor h = at::empty({n}, at::kBFloat16);
      fsdp::dequantize_into(packed, n, block, h);
      EXPECT_TRUE(at::equal(h, y.to(at::kBFloat16)));
    }
  }
}

TEST(Quantize, AllZeroAndNonFinite) {
  at::Tensor z = at::zeros({100});
  at::Tensor p = at::empty({fsdp::quantized_bytes(100, 32)}, at::kByte);
  fsdp::quantize_into(z, p, 32);
  EXPECT_TRUE(at::equal(fsdp::dequantize(p, 100, 32), z));
  EXPECT_TRUE(at::equal(fsdp::packed_scales(p, 100, 32), at::zeros({4})));
  // A NaN makes its block NaN after the round trip (never a silently finite value).
  at::Tensor x = at::ones({64});
  x[40] = std::nanf("");
  p = at::empty({fsdp::quantized_bytes(64, 32)}, at::kByte);
  fsdp::quantize_into(x, p, 32);
  at::Tensor y = fsdp::dequantize(p, 64, 32);
  EXPECT_TRUE(at::equal(y.narrow(0, 0, 32), x.narrow(0, 0, 32)));
  EXPECT_TRUE(at::isnan(y.narrow(0, 32, 32)).all().item<bool>());
}

// ---- the engine ----------------------------------------------------------------------

constexpr int kMicro = 2;

struct Run {
  fsdp::ShardedGroups g;
  std::unique_ptr<tiny::Model> model;
  std::unique_ptr<fsdp::Engine> engine;
};

// hybrid_shard over simulated hosts of 2 ranks (replicas across "nodes"), or full_shard.
std::unique_ptr<Run> make_run(fsdp::Strategy s, const fsdp::Compression& c) {
  auto run = std::make_unique<Run>();
  fsdp::GroupOptions o;
  o.strategy = s;
  o.simulate_ranks_per_host = 2;
  o.backend = "mpi";
  o.comm.timeout_s = 120;
  o.secondary_shards = c.secondary_shards;
  run->g = fsdp::open_groups(MPI_COMM_WORLD, o);
  tiny::Config tc;
  run->model = std::make_unique<tiny::Model>(tc, at::kMeta);
  fsdp::EngineOptions eo;
  eo.strategy = s;
  eo.wrap_types = {run->model->blocks[0]->name()};
  eo.compression = c;
  eo.host_id = run->g.topo.host_id;
  run->engine = std::make_unique<fsdp::Engine>(*run->model, run->g.comms.engine(), eo, tiny::init_param);
  return run;
}

at::Tensor batch_of(const tiny::Config& c, int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  at::Tensor all = at::randint(c.vocab, {static_cast<int64_t>(world_size()) * kMicro, c.seq + 1}, gen, at::kLong);
  return all.narrow(0, static_cast<int64_t>(world_rank()) * kMicro, kMicro);
}

// One forward + backward of this rank's micro-batch of `step` (gradient shards averaged).
void backward(Run& r, int step) {
  const tiny::Config& c = r.model->c;
  at::Tensor b = batch_of(c, step);
  r.engine->zero_grad();
  r.engine->set_last_micro_batch(true);
  r.model->loss(b.narrow(1, 0, c.seq), b.narrow(1, 1, c.seq)).backward();
}

std::vector<at::Tensor> grads(Run& r) {
  std::vector<at::Tensor> out;
  for (fsdp::FlatParam* fp : r.engine->flat_params()) out.push_back(fp->grad_shard().clone());
  return out;
}

bool hybrid_world() { return world_size() == 4; }

// Bytes the engine counted (inside, between nodes) since `before`, summed over the ranks.
std::pair<double, double> sent_since(const fsdp::CommStats& before, fsdp::Engine& e) {
  const fsdp::CommStats now = e.comm_stats();
  double mine[2] = {static_cast<double>(now.intra_node_bytes - before.intra_node_bytes),
                    static_cast<double>(now.inter_node_bytes - before.inter_node_bytes)};
  double all[2];
  MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return {all[0], all[1]};
}

TEST(QuantizedGradients, ErrorFeedbackInvariantOverTwoSteps) {
  if (!hybrid_world()) GTEST_SKIP() << "2 simulated hosts x 2 ranks";
  fsdp::Compression q;
  q.quantize_grads = true;
  q.block = 64;
  auto quant = make_run(fsdp::Strategy::HybridShard, q);
  auto exact = make_run(fsdp::Strategy::HybridShard, fsdp::Compression{});
  const int R = 2;
  ASSERT_EQ(quant->engine->residual_names().size(), 2u);
  std::vector<at::Tensor> carried;  // sum over replicas of the residuals before this step
  for (int step = 0; step < 2; ++step) {
    const fsdp::CommStats q0 = quant->engine->comm_stats(), e0 = exact->engine->comm_stats();
    backward(*quant, step);
    backward(*exact, step);
    // Only the replica average crosses nodes; quantized it moves about a quarter of the bytes,
    // and the traffic inside the node is the same.
    const auto [q_intra, q_inter] = sent_since(q0, *quant->engine);
    const auto [e_intra, e_inter] = sent_since(e0, *exact->engine);
    EXPECT_GT(e_inter, 0);
    EXPECT_EQ(q_intra, e_intra);
    EXPECT_LT(q_inter, 0.3 * e_inter);
    // Both see the same weights (no optimizer step), so the same per-replica gradients.
    std::vector<at::Tensor> gq = grads(*quant), ge = grads(*exact);
    auto& res = quant->engine->residual_staging(true);
    ASSERT_EQ(res.size(), gq.size());
    double worst = 0, moved = 0;
    for (size_t i = 0; i < gq.size(); ++i) {
      at::Tensor e = res[i][0] + res[i][1];
      // sum of what was sent (R * average of the dequantized) + residuals
      //   == sum of the true gradients + the residuals carried in.
      at::Tensor lhs = gq[i].to(at::kDouble) * R + e.to(at::kDouble);
      at::Tensor rhs = ge[i].to(at::kDouble) * R + (step ? carried[i].to(at::kDouble) : at::zeros_like(lhs));
      const double scale = ge[i].abs().max().item<double>() + 1e-30;
      worst = std::max(worst, (lhs - rhs).abs().max().item<double>() / scale);
      moved = std::max(moved, (gq[i] - ge[i]).abs().max().item<double>() / scale);
      if (static_cast<int>(carried.size()) <= static_cast<int>(i)) carried.push_back(e.clone());
      else carried[i] = e.clone();
    }
    EXPECT_LT(worst, 1e-5) << "step " << step;
    // It did quantize (the result differs from fp32), within a few int8 steps.
    EXPECT_GT(moved, 1e-6) << "step " << step;
    EXPECT_LT(moved, 0.05) << "step " << step;
  }
  // Every replica holds the same averaged gradient bits (summed in replica order).
  for (size_t i = 0; i < quant->engine->flat_params().size(); ++i) {
    fsdp::FlatParam* fp = quant->engine->flat_params()[i];
    at::Tensor mine = fp->grad_shard().clone(), other = mine.clone();
    MPI_Comm rep = quant->g.mesh->replicate_comm();
    int rr = 0;
    MPI_Comm_rank(rep, &rr);
    MPI_Bcast(other.data_ptr<float>(), static_cast<int>(other.numel()), MPI_FLOAT, 0, rep);
    EXPECT_TRUE(at::equal(mine, other)) << "flat " << i;
  }
}

TEST(QuantizedWeights, GatherCloseToExactAndCountsFewerBytes) {
  if (!hybrid_world()) GTEST_SKIP() << "2 simulated hosts x 2 ranks";
  fsdp::Compression q;
  q.quantize_weights = true;
  q.block = 32;
  q.guard_every = 1;  // measured at every step; default threshold: no fallback
  auto quant = make_run(fsdp::Strategy::FullShard, q);
  auto exact = make_run(fsdp::Strategy::FullShard, fsdp::Compression{});
  backward(*quant, 0);
  backward(*exact, 0);
  const fsdp::CommStats s = quant->engine->comm_stats();
  EXPECT_GT(s.guard_checks, 0);
  EXPECT_GT(s.weight_rel_error, 1e-5);   // int8 does lose something
  EXPECT_LT(s.weight_rel_error, 0.02);   // ... about a percent at most on these weights
  EXPECT_EQ(s.weight_fallbacks, 0);
  // The gradients from quantized weights stay close to the exact ones.
  std::vector<at::Tensor> gq = grads(*quant), ge = grads(*exact);
  double d2 = 0, n2 = 0;
  for (size_t i = 0; i < gq.size(); ++i) {
    d2 += (gq[i] - ge[i]).pow(2).sum().item<double>();
    n2 += ge[i].pow(2).sum().item<double>();
  }
  double tot[2] = {d2, n2}, all[2];
  MPI_Allreduce(tot, all, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_GT(all[0], 0);
  EXPECT_LT(std::sqrt(all[0] / all[1]), 0.05);
}

TEST(AccuracyGuard, ForcedLargeErrorFallsBackAndThenMatchesTheExactRunBitForBit) {
  if (!hybrid_world()) GTEST_SKIP() << "2 simulated hosts x 2 ranks";
  fsdp::Compression q;
  q.quantize_weights = q.quantize_grads = true;
  q.block = 64;
  q.guard_every = 1;
  q.guard_threshold = 1e-7;  // far below int8's error: every unit must fall back
  ::testing::internal::CaptureStderr();
  auto quant = make_run(fsdp::Strategy::HybridShard, q);
  auto exact = make_run(fsdp::Strategy::HybridShard, fsdp::Compression{});
  backward(*quant, 0);
  backward(*exact, 0);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const fsdp::CommStats s = quant->engine->comm_stats();
  const int flats = static_cast<int>(quant->engine->flat_params().size());
  EXPECT_EQ(s.weight_fallbacks, flats);
  EXPECT_EQ(s.grad_fallbacks, flats);
  EXPECT_GT(s.weight_rel_error, q.guard_threshold);
  EXPECT_GT(s.grad_rel_error, q.guard_threshold);
  EXPECT_NE(err.find("accuracy guard"), std::string::npos) << err;
  // The fallback used the exact results: the same gradient bits as the unquantized run.
  std::vector<at::Tensor> gq = grads(*quant), ge = grads(*exact);
  for (size_t i = 0; i < gq.size(); ++i) EXPECT_TRUE(at::equal(gq[i], ge[i])) << "flat " << i;
  // And it stays in full precision on the next step.
  backward(*quant, 1);
  backward(*exact, 1);
  gq = grads(*quant);
  ge = grads(*exact);
  for (size_t i = 0; i < gq.size(); ++i) EXPECT_TRUE(at::equal(gq[i], ge[i])) << "step 1 flat " << i;
}

TEST(SecondaryShards, BackwardGathersStayInTheNodeWithTheSameBits) {
  if (!hybrid_world()) GTEST_SKIP() << "2 simulated hosts x 2 ranks";
  optim::KokkosScope kokkos;
  fsdp::Compression hp;
  hp.secondary_shards = true;
  auto sec = make_run(fsdp::Strategy::FullShard, hp);
  auto plain = make_run(fsdp::Strategy::FullShard, fsdp::Compression{});
  fsdp::ShardedOptimizer opt_sec(*sec->engine, fsdp::OptimizerConfig{});
  fsdp::ShardedOptimizer opt_plain(*plain->engine, fsdp::OptimizerConfig{});
  // The units' secondary shards: 1/2 (the node) of each block's unsharded bytes.
  int64_t want = 0;
  for (const fsdp::UnitPlan& u : sec->engine->layout())
    if (!u.is_root() && !u.is_ignored())
      for (const auto& f : u.flats) want += f.padded / 2 * 4;
  for (int step = 0; step < 3; ++step) {
    const fsdp::CommStats s0 = sec->engine->comm_stats(), p0 = plain->engine->comm_stats();
    sec->engine->reset_peaks();
    backward(*sec, step);
    backward(*plain, step);
    std::vector<at::Tensor> gs = grads(*sec), gp = grads(*plain);
    for (size_t i = 0; i < gs.size(); ++i) EXPECT_TRUE(at::equal(gs[i], gp[i])) << "step " << step << " flat " << i;
    const fsdp::MemoryStats m = sec->engine->memory();
    EXPECT_EQ(m.peak_secondary_bytes, want) << "step " << step;
    EXPECT_EQ(m.live_secondary_bytes, 0) << "step " << step;
    // The backward gathers moved from the world ring (which crosses the node) to the node: of
    // 3 collectives per block (gather, gather, reduce-scatter) one leaves the link.
    const auto [s_intra, s_inter] = sent_since(s0, *sec->engine);
    const auto [p_intra, p_inter] = sent_since(p0, *plain->engine);
    EXPECT_GT(p_inter, 0);
    EXPECT_LT(s_inter, 0.8 * p_inter);
    EXPECT_GT(s_intra, 0);
    // The masters change between steps: the next forward must gather them, not a stale secondary.
    opt_sec.step(1e-2f);
    opt_plain.step(1e-2f);
  }
}

}  // namespace
