// The planner's traffic model: one step's collectives per rank, ring algorithms over the groups the
// strategy makes, what crosses a host's link and what it costs (docs/memory-planner.md).
#include "shardtrain/plan/traffic.h"

#include <c10/core/ScalarType.h>

#include <algorithm>

#include "shardtrain/comm/ring_model.h"
#include "shardtrain/fsdp/quantize.h"
#include "shardtrain/plan/strategy_plan.h"
#include "shardtrain/runtime/device_mesh.h"
#include "shardtrain/util/error.h"

namespace shardtrain::plan {
namespace {

using comm::RingOp;
using comm::ring_bytes_sent;
using comm::ring_steps;

int64_t dtype_bytes(at::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }
}  // namespace

// Ring edges that leave the busiest host when every group of a family runs its ring at once,
// in group-rank order (family "shard": the groups [kS, (k+1)S); "replicate": {j, j+S, j+2S, ...}).
// A rank sends its ring bytes along its edge to the next member; an edge to another host
// crosses the sender's link, so a host's link carries (edges leaving it) x (bytes per rank).
// full_shard over 2 hosts of 2: 1 edge (1 -> 2); hybrid_shard's replicate groups {0,2}, {1,3}:
// 2 edges (0 -> 2 and 1 -> 3 share host 0's link).
int ring_edges_leaving_busiest_host(int N, int G, int S, bool shard_family) {
  std::vector<int> leaving(static_cast<size_t>(N / G), 0);
  const int groups = shard_family ? N / S : S, members = shard_family ? S : N / S;
  auto rank_of = [&](int g, int i) { return shard_family ? g * S + i : g + i * S; };
  for (int g = 0; g < groups && members > 1; ++g)
    for (int i = 0; i < members; ++i) {
      const int from = rank_of(g, i) / G, to = rank_of(g, (i + 1) % members) / G;
      if (from != to) ++leaving[from];
    }
  return *std::max_element(leaving.begin(), leaving.end());
}

double link_weight(const PlanSettings& ps, int edges) {
  if (edges <= 0) return 1.0;
  if (edges == 1) return ps.inter_host_weight;
  const size_t i = static_cast<size_t>(edges - 2);
  return i < ps.shared_link_weights.size() ? ps.shared_link_weights[i] : ps.inter_host_weight * edges;
}

// Communication per rank per step of plan p (its units and groups already set), with the
// quantized weight gather (qw) and / or the quantized replica average (qg): ring algorithms, an
// all-gather or reduce-scatter over S ranks sends (S-1)/S of the buffer, an all-reduce over R
// ranks 2(R-1)/R; quantized, a gather sends (S-1) packed shards (int8 + an fp32 scale per
// fsdp.quant_block values) and the replica average is an all-gather of R-1 packed shards. An
// NF4 flat's gather sends (S-1) of its packed NF4 shards (fsdp::FlatPlan::shard_bytes). The
// accuracy guard adds the exact collective every quant_guard_every steps (amortised here).
Traffic step_traffic(const PlanSettings& ps, fsdp::Strategy st, const StrategyPlan& p, bool qw, bool qg, bool hp) {
  Traffic out;
  const int N = ps.ranks, G = ps.ranks_per_host, S = p.shard_size;
  // hpZ: full_shard's backward gathers run over the node group (parallel.shard_group_size or the
  // host), inside the host, in full param_dtype from the secondary shards.
  const int Gn = runtime::mesh_shard_size(ps.shard_group_size, G);
  double ag_node = 0;
  const int64_t block = ps.engine.compression.block;
  const double guard = ps.engine.compression.guard_every > 0 ? 1.0 / ps.engine.compression.guard_every : 0.0;
  const int64_t b_reduce = dtype_bytes(ps.engine.mp.reduce_dtype);
  double ag = 0, rs = 0, ar_rep = 0, ar_world = 0;
  const int R = p.replicate_size;
  // DiLoCo: no replica average in the inner steps (the outer sync is added below, per step).
  const bool diloco = runs_diloco(ps, st, S);
  if (diloco) qg = false;
  // Ring edges that leave the busiest host, per family (below), and the time weight of its bytes.
  const int es = ring_edges_leaving_busiest_host(N, G, S, true);
  const int er = ring_edges_leaving_busiest_host(N, G, S, false);
  const int ew = ring_edges_leaving_busiest_host(N, G, 1, false);
  auto weight = [&](int edges) { return std::max(1.0, link_weight(ps, edges)); };
  auto emit = [&](CollectiveKind k, int unit, double bytes, int steps, int edges) {
    if (bytes <= 0) return;
    PlannedCollective c;
    c.kind = k;
    c.unit = unit;
    c.bytes = bytes;
    c.ring_steps = steps;
    c.weight = weight(edges);
    c.crosses_link = edges > 0;
    out.collectives.push_back(c);
  };
  for (size_t ui = 0; ui < p.units.size(); ++ui) {
    const auto& u = p.units[ui];
    const int unit = static_cast<int>(ui);
    for (const auto& f : u.flats) {
      // A frozen flat is only gathered: no gradient to reduce-scatter or average (fsdp::FlatPlan::frozen).
      if (u.is_ignored()) {
        if (!f.frozen) ar_world += ring_bytes_sent(RingOp::AllReduce, N, 4.0 * f.numel);
        continue;
      }
      const int gathers = u.is_root() ? 1 : (fsdp::reshards_after_forward(st) ? 2 : 1);
      if (st != fsdp::Strategy::NoShard && f.nf4) {
        // QLoRA's base (fsdp::FlatPlan::nf4): every gather moves the packed shards, codes and
        // statistics (S x shard_bytes()), over the shard group each time: the engine neither
        // quantizes them again (quantize_weights) nor keeps a secondary shard of them (hpZ).
        const double codes = ring_bytes_sent(RingOp::AllGather, S, static_cast<double>(S) * f.shard_bytes());
        ag += ps.grad_accum * gathers * codes;
        emit(CollectiveKind::ForwardGather, unit, codes, ring_steps(RingOp::AllGather, S), es);
        if (gathers == 2) emit(CollectiveKind::BackwardGather, unit, codes, ring_steps(RingOp::AllGather, S), es);
        continue;  // frozen: nothing to reduce or average
      }
      if (st != fsdp::Strategy::NoShard) {
        const double plain = ring_bytes_sent(RingOp::AllGather, S, f.padded * f.elem_bytes());
        const double packed = ring_bytes_sent(RingOp::AllGather, S, S * fsdp::quantized_bytes(f.shard_numel, block));
        const double one = qw ? packed + guard * plain : plain;
        emit(CollectiveKind::ForwardGather, unit, one, ring_steps(RingOp::AllGather, S), es);
        if (hp && gathers == 2) {
          ag += ps.grad_accum * one;
          const double node = ring_bytes_sent(RingOp::AllGather, Gn, f.padded * f.elem_bytes());
          ag_node += ps.grad_accum * node;
          emit(CollectiveKind::BackwardGather, unit, node, ring_steps(RingOp::AllGather, Gn), 0);
        } else {
          ag += ps.grad_accum * gathers * one;
          if (gathers == 2) emit(CollectiveKind::BackwardGather, unit, one, ring_steps(RingOp::AllGather, S), es);
        }
        if (!f.frozen) {
          const double scatter = ring_bytes_sent(RingOp::ReduceScatter, S, f.padded * b_reduce);
          rs += ps.grad_accum * scatter;
          emit(CollectiveKind::ReduceScatter, unit, scatter, ring_steps(RingOp::ReduceScatter, S), es);
        }
      }
      if (R > 1 && !diloco && !f.frozen) {
        const double plain = ring_bytes_sent(RingOp::AllReduce, R, 4.0 * f.shard_numel);
        ar_rep += qg ? ring_bytes_sent(RingOp::AllGather, R, R * fsdp::quantized_bytes(f.shard_numel, block)) + guard * plain : plain;
      }
    }
  }
  // The step's all-reduces, one coalesced call per group (ar_rep, ar_world are per step): qgZ's
  // replica average is an all-gather of packed shards (R - 1 steps), else a ring all-reduce.
  emit(CollectiveKind::ReplicaAllReduce, -1, ar_rep, ring_steps(qg ? RingOp::AllGather : RingOp::AllReduce, R), er);
  emit(CollectiveKind::ReplicaAllReduce, -1, ar_world, ring_steps(RingOp::AllReduce, N), ew);
  // DiLoCo's outer sync, once per cycle of H inner steps: its bytes per step are 1/H of a cycle's.
  double ar_outer = 0, link_outer = 0, cost_outer = 0;
  if (diloco) {
    const OuterSync o = outer_sync_traffic(ps, p);
    const double H = static_cast<double>(std::max<int64_t>(1, ps.engine.replica_sync.inner_steps));
    ar_outer = o.bytes_per_cycle / H;
    link_outer = o.link_bytes_per_cycle / H;
    cost_outer = o.cost_per_cycle / H;
  }
  ar_rep += ar_outer;
  out.volume.all_gather = static_cast<int64_t>(ag + ag_node);
  out.volume.reduce_scatter = static_cast<int64_t>(rs);
  out.volume.all_reduce = static_cast<int64_t>(ar_rep + ar_world);
  const int64_t shard_part = static_cast<int64_t>(ag) + out.volume.reduce_scatter;
  (p.shard_spans_hosts ? out.volume.inter_host : out.volume.intra_host) += shard_part;
  out.volume.intra_host += static_cast<int64_t>(ag_node);
  (p.replicate_spans_hosts || (st == fsdp::Strategy::NoShard && N > G) ? out.volume.inter_host : out.volume.intra_host) +=
      out.volume.all_reduce;
  // What crosses the busiest host's link, and the cost of each family of rings: bytes per rank
  // times max(1, link_weight(edges that share the link)): a ring runs at its slowest edge, and
  // the rings of one family run at the same time (hybrid_shard's replicate groups all cross one
  // link, and the flows that share it get what the measured weight says, not a fair split).
  // Ignored units' all-reduces run over the world (a replicate family of shard size 1).
  out.volume.inter_host_link =
      static_cast<int64_t>(es * (ag + rs) + er * (ar_rep - ar_outer) + link_outer + ew * ar_world);
  auto cost = [&](double bytes, int edges) { return bytes * weight(edges); };
  out.cost = cost(ag + rs, es) + cost(ar_rep - ar_outer, er) + cost_outer + cost(ar_world, ew) + ag_node;
  return out;
}

// One fragment flat's outer average: fsdp::wire_average_bytes_sent, the wire formats' own count
// (fp32 / bf16 a ring all-reduce, int8 / int4 an all-gather of packed vectors), plus the
// accuracy guard's exact fp32 average on a `guard` fraction of the outer steps.
double outer_wire_bytes(int64_t n, fsdp::WireFormat f, int64_t block, int ranks, double guard) {
  const double wire = fsdp::wire_average_bytes_sent(n, f, block, ranks, false);
  return wire + guard * (fsdp::wire_average_bytes_sent(n, f, block, ranks, true) - wire);
}

// Fragments are consecutive groups of units (fsdp::fragment_of_unit, the engine's rule); a fragment's average is one call over its flats' shards, counted
// per flat (packed vectors per flat, as the quantized replica average packs them).
OuterSync outer_sync_traffic(const PlanSettings& ps, const StrategyPlan& p) {
  OuterSync out;
  const int U = static_cast<int>(p.units.size()), R = p.replicate_size;
  const int F = ps.engine.replica_sync.fragments;
  fsdp::check_fragments(F, U);
  const fsdp::WireFormat wire = ps.engine.replica_sync.outer_dtype;
  const bool quantized = fsdp::is_quantized(wire);
  const double guard = quantized && ps.engine.compression.guard_every > 0 ? 1.0 / ps.engine.compression.guard_every : 0.0;
  const int er = ring_edges_leaving_busiest_host(ps.ranks, ps.ranks_per_host, p.shard_size, false);
  const double w = std::max(1.0, link_weight(ps, er));
  // Fragment f's first unit (first_unit[F] = U): fragments are consecutive and none is empty (F <= U).
  for (int u = 0, f = 0; f <= F; ++f) {
    while (u < U && fsdp::fragment_of_unit(u, U, F) < f) ++u;
    out.first_unit.push_back(u);
  }
  for (int f = 0; f < F; ++f) {
    double bytes = 0;
    for (int u = out.first_unit[f]; u < out.first_unit[f + 1]; ++u)
      for (const auto& fl : p.units[static_cast<size_t>(u)].flats)
        if (!fl.frozen) bytes += outer_wire_bytes(fl.shard_numel, wire, ps.engine.compression.block, R, guard);
    PlannedCollective c;
    c.kind = CollectiveKind::ReplicaAllReduce;
    c.unit = -1;
    c.bytes = bytes;
    c.ring_steps = ring_steps(quantized ? RingOp::AllGather : RingOp::AllReduce, R);
    c.weight = w;
    c.crosses_link = er > 0;
    out.fragments.push_back(c);
    out.bytes_per_cycle += bytes;
    out.link_bytes_per_cycle += er * bytes;
    out.cost_per_cycle += bytes * w;
  }
  return out;
}

}  // namespace shardtrain::plan
