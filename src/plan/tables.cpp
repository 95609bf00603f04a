// The planner's text: the table of every strategy, the sharding diagrams, the recommendation.
#include "shardtrain/plan/tables.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "shardtrain/fsdp/quantize.h"
#include "shardtrain/plan/bytes.h"

namespace shardtrain::plan {
namespace {

char rank_symbol(int r) {
  static const char* sym = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  return r < 62 ? sym[r] : '#';
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return v < 0 ? "-" + out : out;
}

// One line per flat: the padded flat cut into shard slices, one symbol per shard rank.
std::string flat_bar(const fsdp::FlatPlan& f, int S, int width) {
  std::string bar(width, ' ');
  for (int i = 0; i < width; ++i) {
    const int64_t e = static_cast<int64_t>((static_cast<double>(i) + 0.5) * f.padded / width);
    bar[i] = e >= f.numel ? '.' : rank_symbol(static_cast<int>(std::min<int64_t>(S - 1, e / f.shard_numel)));
  }
  return "[" + bar + "]";
}

std::string unit_label(const fsdp::UnitPlan& u, const fsdp::FlatPlan& f) {
  // An NF4 flat (QLoRA's base) is computed in its dtype but stored and gathered as NF4 codes.
  return u.name + (u.flats.size() > 1 ? std::string(" (") + (f.nf4 ? "nf4" : fsdp::dtype_name(f.dtype)) + ")" : std::string());
}

}  // namespace

std::string describe_alternatives(const PlanSettings& ps, const std::vector<Alternative>& alts, int64_t device_bytes) {
  std::ostringstream os;
  for (const Alternative& a : alts) {
    const MemoryBreakdown& m = a.mem();
    os << "  " << a.change << ": ";
    if (!a.fits) {
      os << "does not fit either (the smallest peak " << format_bytes(m.total) << ", "
         << fsdp::to_string(a.plan.strategy) << " with recomputation)\n";
      continue;
    }
    os << fsdp::to_string(a.plan.strategy) << (a.recompute ? " with fsdp.activation_checkpointing = true" : "")
       << ", peak " << format_bytes(m.total) << " of " << format_bytes(device_bytes) << " per rank";
    if (m.host > 0)
      os << "; host memory " << format_bytes(m.host) << " per rank, " << format_bytes(m.host * a.ranks_per_host)
         << " per host of " << a.ranks_per_host << " rank" << (a.ranks_per_host > 1 ? "s" : "");
    if (!a.set.empty()) os << " (" << a.set << ")";
    os << "\n";
  }
  (void)ps;
  return os.str();
}

std::string sharding_diagram(const PlanSettings& ps, const StrategyPlan& p, int width) {
  std::ostringstream os;
  const int S = p.shard_size, R = p.replicate_size, G = ps.ranks_per_host;
  os << "sharding: " << fsdp::to_string(p.strategy) << " - ";
  if (S == 1) {
    os << "every rank holds every unit whole (" << R << " replica" << (R > 1 ? "s" : "") << ")\n";
  } else {
    os << R << " shard group" << (R > 1 ? "s" : "") << " of " << S << " ranks";
    for (int g = 0; g < R && g < 4; ++g) {
      os << (g == 0 ? ": " : ", ") << "{";
      for (int r = 0; r < S; ++r) os << (r ? "," : "") << g * S + r;
      os << "}";
    }
    if (R > 4) os << ", ...";
    os << "; digit = shard rank";
    if (R > 1) os << " (world rank = group x " << S << " + digit; the ranks with one digit form a replicate group and hold the same slice)";
    os << "; '.' = padding\n";
  }
  size_t name_w = 6;
  for (const auto& u : p.units)
    for (const auto& f : u.flats) name_w = std::max(name_w, unit_label(u, f).size());
  name_w = std::min<size_t>(name_w, 40);
  char head[256];
  std::snprintf(head, sizeof head, "  %-*s %14s %12s  %s\n", static_cast<int>(name_w), "unit", "elements",
                S > 1 ? "per rank" : "", S > 1 ? "layout over the flat parameter" : "");
  os << head;
  // Fold runs of units whose flats have the same sizes (the blocks) into one line.
  size_t i = 0;
  while (i < p.units.size()) {
    size_t j = i + 1;
    auto same = [&](const fsdp::UnitPlan& a, const fsdp::UnitPlan& b) {
      if (a.is_root() || b.is_root() || a.is_ignored() != b.is_ignored() || a.flats.size() != b.flats.size()) return false;
      for (size_t k = 0; k < a.flats.size(); ++k)
        if (a.flats[k].numel != b.flats[k].numel || a.flats[k].dtype != b.flats[k].dtype || a.flats[k].nf4 != b.flats[k].nf4)
          return false;
      return true;
    };
    while (j < p.units.size() && same(p.units[i], p.units[j])) ++j;
    const fsdp::UnitPlan& u = p.units[i];
    for (const auto& f : u.flats) {
      std::string label = unit_label(u, f);
      if (label.size() > name_w) label = "..." + label.substr(label.size() - name_w + 3);
      char line[512];
      const int group = f.shard_size;
      std::snprintf(line, sizeof line, "  %-*s %14s %12s  %s", static_cast<int>(name_w), label.c_str(),
                    with_commas(f.numel).c_str(), group > 1 ? with_commas(f.shard_numel).c_str() : "whole",
                    group > 1 ? flat_bar(f, group, width).c_str() : "");
      os << line;
      if (u.is_ignored()) os << " (ignored: whole on every rank)";
      os << "\n";
    }
    if (j - i > 1) {
      os << "  ... and " << (j - i - 1) << " more unit" << (j - i > 2 ? "s" : "") << " with the same layout ("
         << p.units[i + 1].name << " .. " << p.units[j - 1].name << ")\n";
    }
    i = j;
  }
  (void)G;
  return os.str();
}

std::string describe_step_assumptions(const PlanSettings& ps) {
  const StepTimeSettings& t = ps.step;
  char b[1300];
  const int busy = ps.ranks_per_host * std::max(1, ps.threads);
  char cores[480];
  auto costs = [](const CoreCosts& k) {  // "bytes x a / b / c, + x / y / z us per collective"
    char c[160];
    std::snprintf(c, sizeof c, "bytes x %.3g / %.3g / %.3g, +%.4g / %.4g / %.4g us per collective", k.weight[0], k.weight[1],
                  k.weight[2], k.sync_us[0], k.sync_us[1], k.sync_us[2]);
    return std::string(c);
  };
  if (t.cores_per_host > 0 && t.cores_per_host < busy)
    std::snprintf(cores, sizeof cores,
                  "%d cores per host for %d ranks x %d threads: compute at %.2f of the rate; communication's core part "
                  "(all-gather / reduce-scatter / all-reduce; rings across the links: %s; inside hosts: %s) serialised "
                  "with it",
                  t.cores_per_host, ps.ranks_per_host, std::max(1, ps.threads), static_cast<double>(t.cores_per_host) / busy,
                  costs(t.link_cores).c_str(), costs(t.intra_cores).c_str());
  else if (t.cores_per_host > 0)
    std::snprintf(cores, sizeof cores, "%d cores per host for %d ranks x %d threads: communication overlaps compute",
                  t.cores_per_host, ps.ranks_per_host, std::max(1, ps.threads));
  else
    std::snprintf(cores, sizeof cores, "cores per host not given: communication overlaps compute");
  char opt[96] = "";
  if (t.optimizer_ns_per_param > 0)
    std::snprintf(opt, sizeof opt, " + the optimizer at %.3g ns per parameter of the rank's shards", t.optimizer_ns_per_param);
  if (t.compute_tflops > 0)
    std::snprintf(b, sizeof b, "compute %.4g TFLOP/s per rank (%s)%s; intra-host edge %.3g GB/s, link edges / W_e; latency %.3g us per ring step; %s",
                  t.compute_tflops, t.compute_source.c_str(), opt, t.intra_busbw_gbps, t.latency_us, cores);
  else
    std::snprintf(b, sizeof b, "no compute rate (communication only, none hidden); intra-host edge %.3g GB/s, link edges / W_e; latency %.3g us per ring step",
                  t.intra_busbw_gbps, t.latency_us);
  return b;
}

std::string format_plan(const PlanSettings& ps, const std::vector<StrategyPlan>& plans, int64_t device_bytes) {
  std::ostringstream os;
  const model::ModelSpec& sp = ps.spec;
  const int hosts = ps.ranks / ps.ranks_per_host;
  os << "# shardtrain plan: " << sp.arch << " (" << sp.n_layers << " x " << sp.d_model << ", " << sp.n_heads
     << " heads, " << with_commas(model::parameter_count(sp)) << " parameters)";
  if (model::input_kind(sp) == model::InputKind::Images) os << ", micro-batch " << ps.micro_batch << " images";
  else os << ", micro-batch " << ps.micro_batch << " x " << sp.seq_len << " tokens";
  os << ", grad_accum " << ps.grad_accum << "\n";
  os << "# " << ps.ranks << " rank" << (ps.ranks > 1 ? "s" : "") << " on " << hosts << " host" << (hosts > 1 ? "s" : "")
     << " (" << ps.ranks_per_host << " per host); device memory " << format_bytes(device_bytes) << " per rank; "
     << fsdp::dtype_name(ps.engine.mp.param_dtype) << " compute, " << fsdp::dtype_name(ps.engine.mp.reduce_dtype)
     << " reduce, " << ps.optimizer << "; activation checkpointing "
     << (ps.engine.activation_checkpointing ? "on" : "off") << " in the deck\n";
  os << "# target " << (ps.target.cuda ? "cuda" : "cpu") << ": attention "
     << (ps.target.fused_attention ? "by the fused kernels (flash / memory-efficient, libtorch >= 2: no T x T scores)"
                                   : "in the explicit form (T x T scores and an fp32 softmax per head)")
     << (ps.target.cuda ? "" : ", libtorch's CPU GEMM workspace") << "\n";
  if (model::input_kind(sp) == model::InputKind::Tokens)
    os << "# windows: data.packing " << ps.windows.packing
       << (ps.windows.attention_span > 0
               ? " (each row its own causal attention: scores of at most " + std::to_string(std::min(ps.windows.attention_span, sp.seq_len)) +
                     " keys per query, the longest row; fill " + std::to_string(static_cast<int>(std::lround(100 * ps.windows.fill))) + "%)"
               : std::string(" (T x T causal attention per window)"))
       << "\n";
  const model::Finetune& ft = sp.finetune;
  if (ft.any()) {
    os << "# fine-tune:";
    if (ft.lora.on()) {
      os << " LoRA rank " << ft.lora.rank << " on ";
      if (ft.lora.targets.empty()) os << "the architecture's default targets";
      for (size_t i = 0; i < ft.lora.targets.size(); ++i) os << (i ? ", " : "") << ft.lora.targets[i];
      os << ";";
    }
    if (ft.lora.nf4())
      os << " the base's linear weights in the blocks as NF4 (QLoRA: blocks of " << ft.lora.nf4_block << ", "
         << (ft.lora.nf4_double_quant ? "double-quantized statistics" : "fp32 absmax per block")
         << "; gathered as codes, dequantized to " << fsdp::dtype_name(ps.engine.mp.param_dtype) << " per use);";
    if (!ft.freeze.empty()) os << " train.freeze " << ft.freeze.size() << " pattern" << (ft.freeze.size() > 1 ? "s" : "") << ";";
    const std::shared_ptr<model::Model> meta = model::build_model(sp, at::kMeta);
    int64_t trains = 0;
    for (const auto& p : meta->parameters())
      if (p.requires_grad()) trains += p.numel();
    os << " " << with_commas(trains) << " trainable parameters; the frozen ones are kept sharded in their dtype"
       << " (no fp32 master, gradient, optimizer state or reduce-scatter)\n";
  }
  if (ps.engine.cpu_offload)
    os << "# fsdp.cpu_offload = true: parameter and gradient shards and the optimizer state live in host memory"
          " (rows host memory); the peaks below are device memory without them (not measured on a GPU yet)\n";
  const fsdp::ReplicaSync& dl = ps.engine.replica_sync;
  if (dl.diloco()) {
    char b[640];
    std::snprintf(b, sizeof b,
                  "# parallel.replica_sync = diloco: the hybrid strategies' replicas exchange nothing for H = %d inner "
                  "steps, then average each of %d fragment%s of their shards in %s (overlapped with %d inner step%s) "
                  "for an outer SGD (lr %.3g, momentum %.3g%s); the other strategies sync every step\n",
                  static_cast<int>(dl.inner_steps), dl.fragments, dl.fragments > 1 ? "s" : "",
                  fsdp::wire_format_name(dl.outer_dtype), static_cast<int>(dl.overlap_steps),
                  dl.overlap_steps == 1 ? "" : "s", dl.outer_lr, dl.outer_momentum,
                  dl.outer_momentum != 0 && dl.nesterov ? ", Nesterov" : "");
    os << b;
  }
  os << "# per rank, bytes at the step's peak (its instant on the last lines); communication per step, sent per rank\n\n";

  int col = 20;
  for (const auto& p : plans) col = std::max(col, static_cast<int>(p.mem.peak_at.size()) + 2);
  auto row = [&](const std::string& label, auto cell) {
    char b[64];
    std::snprintf(b, sizeof b, "%-26s", label.c_str());
    os << b;
    for (const auto& p : plans) {
      std::snprintf(b, sizeof b, "%*s", col, cell(p).c_str());
      os << b;
    }
    os << "\n";
  };
  row("", [](const StrategyPlan& p) { return std::string(fsdp::to_string(p.strategy)); });
  row("shard x replicate", [](const StrategyPlan& p) {
    return std::to_string(p.shard_size) + " x " + std::to_string(p.replicate_size);
  });
  row("params (fp32 shards)", [](const StrategyPlan& p) { return format_bytes(p.mem.params); });
  // Frozen shards: in their dtype, and QLoRA's NF4 shards (codes + statistics) on a row of their own.
  bool any_frozen = false, any_nf4 = false;
  for (const auto& p : plans) {
    any_frozen = any_frozen || p.mem.frozen > p.mem.frozen_nf4;
    any_nf4 = any_nf4 || p.mem.frozen_nf4 > 0;
  }
  if (any_frozen)
    row("frozen shards (" + std::string(fsdp::dtype_name(ps.engine.mp.param_dtype)) + ")",
        [](const StrategyPlan& p) { return format_bytes(p.mem.frozen - p.mem.frozen_nf4); });
  if (any_nf4) row("frozen shards (NF4)", [](const StrategyPlan& p) { return format_bytes(p.mem.frozen_nf4); });
  row("grads (fp32 shards)", [](const StrategyPlan& p) { return format_bytes(p.mem.grads); });
  row("optimizer state", [](const StrategyPlan& p) { return format_bytes(p.mem.optim); });
  if (dl.diloco())
    row("outer copy + momentum", [](const StrategyPlan& p) { return p.diloco ? format_bytes(p.mem.outer) : std::string("-"); });
  row("unsharded params", [](const StrategyPlan& p) { return format_bytes(p.mem.unsharded); });
  if (any_nf4) row("NF4 gathers in flight", [](const StrategyPlan& p) { return format_bytes(p.mem.nf4_wire); });
  row("unsharded grad buffers", [](const StrategyPlan& p) { return format_bytes(p.mem.grad_buffers); });
  row("activations + working", [](const StrategyPlan& p) { return format_bytes(p.mem.activations); });
  row(ps.engine.activation_checkpointing ? "peak (deck: recompute)" : "peak (deck)",
      [](const StrategyPlan& p) { return format_bytes(p.mem.total); });
  row("  of device memory", [&](const StrategyPlan& p) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f%%%s", 100.0 * p.mem.total / device_bytes, p.mem.total > device_bytes ? " OOM" : "");
    return std::string(b);
  });
  if (ps.engine.cpu_offload) {
    row("host memory / rank", [](const StrategyPlan& p) { return format_bytes(p.mem.host); });
    row("host memory / host", [&](const StrategyPlan& p) { return format_bytes(p.mem.host * ps.ranks_per_host); });
  }
  row("peak without recompute", [](const StrategyPlan& p) { return format_bytes(p.mem_no_recompute.total); });
  row("peak with recompute", [](const StrategyPlan& p) { return format_bytes(p.mem_recompute.total); });
  row("saved activations", [](const StrategyPlan& p) { return format_bytes(p.mem_no_recompute.saved_activations); });
  row("  with recompute", [](const StrategyPlan& p) { return format_bytes(p.mem_recompute.saved_activations); });
  row("all-gather / step", [](const StrategyPlan& p) { return format_bytes(p.comm.all_gather); });
  row("reduce-scatter / step", [](const StrategyPlan& p) { return format_bytes(p.comm.reduce_scatter); });
  row("all-reduce / step", [](const StrategyPlan& p) { return format_bytes(p.comm.all_reduce); });
  row("intra-host / step", [](const StrategyPlan& p) { return format_bytes(p.comm.intra_host); });
  row("inter-host / step", [](const StrategyPlan& p) { return format_bytes(p.comm.inter_host); });
  row("host link / step", [](const StrategyPlan& p) { return format_bytes(p.comm.inter_host_link); });
  // What each quantization option would leave between hosts (fsdp.quantize_weights / _grads).
  auto opt_bytes = [](int64_t b) { return b < 0 ? std::string("-") : format_bytes(b); };
  row("inter-host, plain", [&](const StrategyPlan& p) { return opt_bytes(p.inter_host_plain); });
  row("  + quantize_weights", [&](const StrategyPlan& p) { return opt_bytes(p.inter_host_qwz); });
  row("  + quantize_grads", [&](const StrategyPlan& p) { return opt_bytes(p.inter_host_qgz); });
  row("  + secondary_shards", [&](const StrategyPlan& p) { return opt_bytes(p.inter_host_hpz); });
  row("  + all that apply", [&](const StrategyPlan& p) { return opt_bytes(p.inter_host_all); });
  if (dl.diloco()) {
    // DiLoCo's outer sync: a cycle's bytes per rank, what crosses the busiest host's link per
    // optimizer step (the cycle's / H) and its ratio to the same strategy syncing every step.
    row("replica sync", [](const StrategyPlan& p) { return std::string(p.diloco ? "diloco" : "every_step"); });
    row("outer sync / cycle", [](const StrategyPlan& p) {
      return p.diloco ? format_bytes(static_cast<int64_t>(p.outer.bytes_per_cycle)) : std::string("-");
    });
    row("inter-node / step", [](const StrategyPlan& p) { return format_bytes(p.comm.inter_host_link); });
    row("  vs every_step", [](const StrategyPlan& p) {
      if (!p.diloco || p.every_step_link <= 0) return std::string("-");
      char b[32];
      std::snprintf(b, sizeof b, "1/%.0f", static_cast<double>(p.every_step_link) / std::max<int64_t>(1, p.comm.inter_host_link));
      return std::string(b);
    });
  }
  row("peak at", [](const StrategyPlan& p) { return p.mem.peak_at; });
  // The step-time estimate (step_time.h) with the deck's recomputation setting.
  auto ms = [](double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f ms", 1e3 * s);
    return std::string(b);
  };
  row("est. compute / step", [&](const StrategyPlan& p) { return ms(p.step.compute_s); });
  row("est. comm / step", [&](const StrategyPlan& p) { return ms(p.step.comm_s); });
  row("est. exposed comm", [&](const StrategyPlan& p) { return ms(p.step.exposed_s); });
  if (dl.diloco()) {
    row("  of it outer sync", [&](const StrategyPlan& p) { return p.diloco ? ms(p.step.outer_exposed_s) : std::string("-"); });
    row("est. inner step", [&](const StrategyPlan& p) { return ms(p.step.inner_step_s()); });
  }
  row("est. step", [&](const StrategyPlan& p) { return ms(p.step.step_s()); });
  os << "# step estimate: " << describe_step_assumptions(ps) << "\n";
  os << "\n";
  for (const auto& p : plans) os << sharding_diagram(ps, p) << "\n";

  bool rc = false;
  const int best = recommend(plans, device_bytes, &rc);
  if (best < 0) {
    int64_t least = plans.empty() ? 0 : plans[0].mem_recompute.total;
    for (const auto& p : plans) least = std::min(least, p.mem_recompute.total);
    os << "recommendation: nothing fits " << format_bytes(device_bytes) << " per rank (the smallest peak is "
       << format_bytes(least) << " with recomputation). Planned instead, one change at a time:\n";
    const std::vector<Alternative> alts = alternatives(ps, device_bytes);
    os << describe_alternatives(ps, alts, device_bytes);
    // Only QLoRA fits these ranks: name it, and the keys that set it.
    if (const Alternative* q = only_qlora_fits(alts, ps.ranks)) {
      const MemoryBreakdown& m = q->mem();
      os << "recommendation: QLoRA, the only change planned above that fits " << ps.ranks << " rank"
         << (ps.ranks > 1 ? "s" : "") << " with the state on the device: " << q->change << ", parallel.strategy = \""
         << fsdp::to_string(q->plan.strategy) << "\"" << (q->recompute ? " with fsdp.activation_checkpointing = true" : "")
         << " (peak " << format_bytes(m.total) << " of " << format_bytes(device_bytes) << " per rank): " << q->set
         << " --set parallel.strategy=" << fsdp::to_string(q->plan.strategy)
         << (q->recompute ? " --set fsdp.activation_checkpointing=true" : "") << "\n";
    }
  } else {
    const StrategyPlan& p = plans[best];
    const MemoryBreakdown& m = rc ? p.mem_recompute : p.mem_no_recompute;
    os << "recommendation: parallel.strategy = \"" << fsdp::to_string(p.strategy) << "\""
       << (p.diloco ? " with parallel.replica_sync = \"diloco\"" : "")
       << (rc ? " with fsdp.activation_checkpointing = true" : "") << " (peak " << format_bytes(m.total) << " of "
       << format_bytes(device_bytes) << ", " << format_bytes(p.comm.intra_host) << " intra-host + "
       << format_bytes(p.comm.inter_host) << " inter-host per rank, " << format_bytes(p.comm.inter_host_link)
       << " over each host's link per step; est. step " << ms((rc ? p.step_recompute : p.step_no_recompute).step_s())
       << "): the shortest estimated step among the strategies that fit"
       << (rc ? "; none fits without recomputation" : " without recomputation") << "\n";
  }
  return os.str();
}

}  // namespace shardtrain::plan
