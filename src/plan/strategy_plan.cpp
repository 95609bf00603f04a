// The plan of each strategy: groups, the engine's layout on a meta model, the memory peak, the
// traffic and the step time; the recommendation among them.
#include "shardtrain/plan/strategy_plan.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "shardtrain/model/lora.h"
#include "shardtrain/runtime/device_mesh.h"
#include "shardtrain/util/error.h"

namespace shardtrain::plan {

const std::vector<fsdp::Strategy>& all_strategies() {
  static const std::vector<fsdp::Strategy> all = {fsdp::Strategy::FullShard, fsdp::Strategy::ShardGradOp,
                                                  fsdp::Strategy::NoShard, fsdp::Strategy::HybridShard,
                                                  fsdp::Strategy::HybridShardZero2};
  return all;
}

namespace {

// The engine's rule (fsdp::strategy_groups) on the mesh the runtime would build.
int group_size_for(const PlanSettings& ps, fsdp::Strategy st) {
  return fsdp::strategy_groups(st, ps.ranks, runtime::mesh_shard_size(ps.shard_group_size, ps.ranks_per_host)).shard_size;
}

// Whether the ranks of one group lie on more than one host (hosts: consecutive blocks of
// ranks_per_host ranks; groups as runtime::DeviceMesh builds them).
bool spans_hosts(const std::vector<int>& members, int ranks_per_host) {
  for (int m : members)
    if (m / ranks_per_host != members.front() / ranks_per_host) return true;
  return false;
}

// step_flops on the model and units plan_strategy already has.
double step_flops(const PlanSettings& ps, const model::Model& m, const std::vector<fsdp::UnitPlan>& units,
                  bool recompute) {
  // The trainer's MFU numerator per item (a token of a language model, an image of a ViT), times
  // the items one rank trains on in a step.
  const double items = static_cast<double>(ps.micro_batch * ps.grad_accum) *
                       (model::input_kind(ps.spec) == model::InputKind::Tokens ? static_cast<double>(ps.spec.seq_len) : 1.0);
  // Rows apart: their tokens' work (fill) with each row's own attention (the trainer's MFU counts the same: DataSource::attention_length).
  const double per_item = ps.windows.attention_length > 0
                              ? ps.windows.fill * m.train_flops_per_token(std::llround(ps.windows.attention_length))
                              : m.train_flops_per_item();
  const double flops = per_item * items;
  // Recomputation runs each block's forward again (a unit's parameters do not depend on S).
  return recompute ? flops * recompute_flops_factor(units) : flops;
}
}  // namespace

double step_flops(const PlanSettings& ps, bool recompute) {
  const std::shared_ptr<model::Model> meta = model::build_model(ps.spec, at::kMeta);
  return step_flops(ps, *meta, fsdp::plan_units(*meta, ps.engine, 1), recompute);
}

StrategyPlan plan_strategy(const PlanSettings& ps, fsdp::Strategy st) {
  StrategyPlan p;
  p.strategy = st;
  const int N = ps.ranks, G = ps.ranks_per_host;
  ST_USER_CHECK(N >= 1, "--ranks must be >= 1 (got ", N, ")");
  ST_USER_CHECK(G >= 1 && N % G == 0, "--ranks-per-host ", G, " must divide --ranks ", N);
  const int S = group_size_for(ps, st);
  ST_USER_CHECK(S >= 1 && N % S == 0, fsdp::to_string(st), ": shard group size ", S, " (parallel.shard_group_size",
                " or --ranks-per-host) must divide --ranks ", N);
  p.shard_size = S;
  p.replicate_size = N / S;
  std::vector<int> shard0, rep0;
  for (int r = 0; r < S; ++r) shard0.push_back(r);
  for (int r = 0; r < p.replicate_size; ++r) rep0.push_back(r * S);
  p.shard_spans_hosts = S > 1 && spans_hosts(shard0, G);
  p.replicate_spans_hosts = p.replicate_size > 1 && spans_hosts(rep0, G);

  fsdp::EngineOptions eo = ps.engine;
  eo.strategy = st;
  const std::shared_ptr<model::Model> meta = model::build_model(ps.spec, at::kMeta);
  p.units = fsdp::plan_units(*meta, eo, S);
  const ActivationBytes a = meta->activation_bytes(cost_query(ps.engine.mp, ps.micro_batch, ps.threads, ps.target, ps.windows.attention_span));
  p.mem_no_recompute = peak_memory(ps, st, p.units, S, a, false);
  p.mem_recompute = peak_memory(ps, st, p.units, S, a, true);
  p.mem = ps.engine.activation_checkpointing ? p.mem_recompute : p.mem_no_recompute;

  // Communication per rank per step, with the deck's quantization options (fsdp.quantize_*)
  // where this strategy runs them, and each option alone for the report.
  const fsdp::Compression& c = ps.engine.compression;
  const fsdp::CompressionSupport runs = fsdp::compression_support(st);
  const bool qw_ok = runs.quantize_weights, qg_ok = runs.quantize_grads, hp_ok = runs.secondary_shards;
  Traffic deck =
      step_traffic(ps, st, p, c.quantize_weights && qw_ok, c.quantize_grads && qg_ok, c.secondary_shards && hp_ok);
  p.comm = deck.volume;
  p.comm_cost = deck.cost;
  p.collectives = std::move(deck.collectives);
  // The step time, from the same collectives (step_time.h), without and with recomputation.
  StepTimeInputs in;
  in.strategy = st;
  in.units = &p.units;
  in.collectives = &p.collectives;
  in.grad_accum = static_cast<int>(ps.grad_accum);
  in.ranks_per_host = G;
  in.threads = ps.threads;
  in.forward_prefetch = ps.engine.forward_prefetch;
  in.backward_prefetch = ps.engine.backward_prefetch;
  for (const auto& u : p.units)
    for (const auto& f : u.flats)
      if (!f.frozen) in.params_per_rank += static_cast<double>(f.shard_numel);  // what the optimizer updates
  // DiLoCo: the inner step replays the collectives above (no replica average), and its outer
  // sync adds a cycle's time / H; every_step_link: the same strategy syncing every step.
  p.diloco = runs_diloco(ps, st, S);
  if (p.diloco) {
    p.outer = outer_sync_traffic(ps, p);
    PlanSettings every = ps;
    every.engine.replica_sync.mode = fsdp::ReplicaSyncMode::EveryStep;
    p.every_step_link = step_traffic(every, st, p, c.quantize_weights && qw_ok, c.quantize_grads && qg_ok,
                                     c.secondary_shards && hp_ok).volume.inter_host_link;
  }
  for (bool rc : {false, true}) {
    in.recompute = rc;
    in.step_flops = step_flops(ps, *meta, p.units, rc);
    StepEstimate& e = rc ? p.step_recompute : p.step_no_recompute;
    e = estimate_step(ps.step, in);
    if (p.diloco) add_outer_sync(ps.step, p.outer.fragments, static_cast<int>(ps.engine.replica_sync.inner_steps),
                                static_cast<int>(ps.engine.replica_sync.overlap_steps), &e);
  }
  p.step = ps.engine.activation_checkpointing ? p.step_recompute : p.step_no_recompute;
  auto inter = [&](bool qw, bool qg, bool hp) { return step_traffic(ps, st, p, qw, qg, hp).volume.inter_host; };
  p.inter_host_plain = inter(false, false, false);
  p.inter_host_qwz = qw_ok ? inter(true, false, false) : -1;
  p.inter_host_qgz = qg_ok && !p.diloco ? inter(false, true, false) : -1;  // DiLoCo: no per-step average
  p.inter_host_hpz = hp_ok ? inter(false, false, true) : -1;
  p.inter_host_all = qw_ok ? inter(true, qg_ok && !p.diloco, hp_ok) : -1;
  return p;
}

std::vector<StrategyPlan> plan_all(const PlanSettings& ps) {
  std::vector<StrategyPlan> out;
  for (fsdp::Strategy st : all_strategies()) {
    if (fsdp::is_hybrid(st)) {
      const int S = group_size_for(ps, st);
      if (S < 1 || ps.ranks % S != 0) continue;  // reported by the caller
    }
    out.push_back(plan_strategy(ps, st));
  }
  return out;
}

int recommend(const std::vector<StrategyPlan>& plans, int64_t device_bytes, bool* recompute) {
  int best = -1;
  bool best_rc = false;
  for (int pass = 0; pass < 2 && best < 0; ++pass) {  // without recomputation first
    auto mem = [&](const StrategyPlan& p) { return pass == 0 ? p.mem_no_recompute.total : p.mem_recompute.total; };
    auto step = [&](const StrategyPlan& p) { return pass == 0 ? p.step_no_recompute.step_s() : p.step_recompute.step_s(); };
    for (size_t i = 0; i < plans.size(); ++i) {
      if (mem(plans[i]) > device_bytes) continue;
      if (best < 0 || step(plans[i]) < step(plans[best]) ||
          (step(plans[i]) == step(plans[best]) && mem(plans[i]) < mem(plans[best]))) {
        best = static_cast<int>(i);
        best_rc = pass == 1;
      }
    }
  }
  if (recompute) *recompute = best_rc;
  return best;
}

namespace {
// The recommendation of every strategy planned under q, or (nothing fits) its smallest peak.
Alternative best_under(const PlanSettings& q, int64_t device_bytes, std::string change) {
  Alternative alt;
  alt.change = std::move(change);
  alt.ranks = q.ranks;
  alt.ranks_per_host = q.ranks_per_host;
  std::vector<StrategyPlan> plans = plan_all(q);
  if (plans.empty()) return alt;
  bool rc = false;
  int i = recommend(plans, device_bytes, &rc);
  alt.fits = i >= 0;
  if (i < 0) {
    i = 0;
    for (size_t j = 1; j < plans.size(); ++j)
      if (plans[j].mem_recompute.total < plans[i].mem_recompute.total) i = static_cast<int>(j);
    rc = true;
  }
  alt.plan = std::move(plans[static_cast<size_t>(i)]);
  alt.recompute = rc;
  return alt;
}

// cpu_offload runs without the ZeRO++ options (fsdp::check_strategy_options).
PlanSettings offloaded(PlanSettings q) {
  q.engine.cpu_offload = true;
  q.engine.compression.quantize_weights = q.engine.compression.quantize_grads = false;
  q.engine.compression.secondary_shards = false;
  return q;
}

PlanSettings with_lora(PlanSettings q) {
  q.spec.finetune.lora.rank = kLoraRank;
  q.spec.finetune.lora.targets = {"all-linear"};
  return q;
}

const char* const kLoraChange = "lora.rank = 16 on lora.targets = [\"all-linear\"]";
const char* const kLoraSet = "--set lora.rank=16 --set lora.targets=all-linear";
const char* const kNf4Change = "lora.base_dtype = \"nf4\" with lora.nf4_double_quant = true (QLoRA)";
const char* const kNf4Set = "--set lora.base_dtype=nf4 --set lora.nf4_double_quant=true";
static_assert(kLoraRank == 16, "kLoraChange and kLoraSet spell the rank");
}  // namespace

PlanSettings with_nf4_base(PlanSettings q, int64_t block, bool double_quant) {
  ST_CHECK(q.spec.finetune.lora.on(), "with_nf4_base: an NF4 base is a LoRA base (lora.rank > 0)");
  ST_CHECK(model::valid_nf4_block(block), "with_nf4_base: block ", block, " is not an NF4 block size");
  q.spec.finetune.lora.nf4_block = block;
  q.spec.finetune.lora.nf4_double_quant = double_quant;
  q.engine.nf4.block = block;
  q.engine.nf4.double_quant = double_quant;
  q.engine.nf4.params = model::nf4_base_params(*model::build_model(q.spec, at::kMeta));
  return q;
}

std::vector<Alternative> alternatives(const PlanSettings& ps, int64_t device_bytes) {
  std::vector<Alternative> out;
  const bool can_offload = !ps.engine.cpu_offload, can_lora = !ps.spec.finetune.lora.on();
  const bool can_nf4 = !ps.spec.finetune.lora.nf4();
  auto add = [&](const PlanSettings& q, std::string change, std::string set, bool qlora) -> Alternative& {
    out.push_back(best_under(q, device_bytes, std::move(change)));
    out.back().set = std::move(set);
    out.back().qlora = qlora;
    return out.back();
  };
  const bool offload_fits =
      can_offload && add(offloaded(ps), "fsdp.cpu_offload = true", "--set fsdp.cpu_offload=true", false).fits;
  // LoRA (a deck without it), and QLoRA: the deck's LoRA, or that LoRA, with its base in NF4.
  std::optional<PlanSettings> lora;
  if (can_lora) {
    try {
      lora = with_lora(ps);
      add(*lora, kLoraChange, kLoraSet, false);
    } catch (const UserError&) {
      // A model too narrow for that rank (lora.rank above a layer's min(in, out)): no LoRA line.
      lora.reset();
    }
  } else {
    lora = ps;
  }
  const bool lora_fits = can_lora && lora && out.back().fits;
  bool qlora_fits = false;
  std::optional<PlanSettings> qlora;
  if (lora && can_nf4) {
    qlora = with_nf4_base(*lora);
    const std::string change = can_lora ? std::string(kLoraChange) + " and " + kNf4Change : std::string(kNf4Change);
    const std::string set = can_lora ? std::string(kLoraSet) + " " + kNf4Set : std::string(kNf4Set);
    qlora_fits = add(*qlora, change, set, true).fits;
  }
  if (can_offload && can_lora && lora && !offload_fits && !lora_fits)
    add(offloaded(*lora), std::string(kLoraChange) + " and fsdp.cpu_offload = true",
        std::string(kLoraSet) + " --set fsdp.cpu_offload=true", false);
  if (can_offload && qlora && !offload_fits && !qlora_fits) {
    const std::string change = (can_lora ? std::string(kLoraChange) + ", " : std::string()) + kNf4Change +
                               " and fsdp.cpu_offload = true";
    const std::string set = (can_lora ? std::string(kLoraSet) + " " : std::string()) + kNf4Set + " --set fsdp.cpu_offload=true";
    add(offloaded(*qlora), change, set, true);
  }
  // More ranks: whole hosts of ranks_per_host, doubling, until a strategy fits (or 64x).
  for (int k = 2; k <= 64 && ps.ranks * k <= (1 << 20); k *= 2) {
    PlanSettings q = ps;
    q.ranks = ps.ranks * k;
    const int hosts = q.ranks / q.ranks_per_host;
    Alternative alt = best_under(q, device_bytes,
                                 "--ranks " + std::to_string(q.ranks) + " (" + std::to_string(hosts) + " host" +
                                     (hosts > 1 ? "s" : "") + " of " + std::to_string(q.ranks_per_host) + ")");
    if (alt.fits || k == 64) {
      out.push_back(std::move(alt));
      break;
    }
  }
  if (ps.micro_batch > 1) {
    PlanSettings q = ps;
    q.micro_batch = 1;
    q.grad_accum = ps.grad_accum * ps.micro_batch;
    out.push_back(best_under(q, device_bytes,
                             "train.micro_batch = 1 (train.grad_accum = " + std::to_string(q.grad_accum) +
                                 ": the same global batch)"));
  }
  if (ps.engine.mp.param_dtype == at::kFloat) {
    PlanSettings q = ps;
    q.engine.mp.param_dtype = at::kBFloat16;
    out.push_back(best_under(q, device_bytes, "fsdp.param_dtype = \"bf16\""));
  }
  return out;
}

const Alternative* only_qlora_fits(const std::vector<Alternative>& alts, int ranks) {
  const Alternative* q = nullptr;
  for (const Alternative& a : alts) {
    if (!a.fits || a.ranks != ranks || a.mem().state_on_host) continue;
    if (!a.qlora) return nullptr;
    if (!q) q = &a;
  }
  return q;
}

}  // namespace shardtrain::plan
