// The planner's step-time estimate: the engine's schedule (fsdp/schedule.cpp) replayed on a
// compute stream and one communication channel, with the collectives the memory planner counted.
#include "shardtrain/plan/step_time.h"

#include <algorithm>
#include <deque>
#include <map>

#include "shardtrain/fsdp/engine.h"

namespace shardtrain::plan {

const char* to_string(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::ForwardGather: return "forward all-gather";
    case CollectiveKind::BackwardGather: return "backward all-gather";
    case CollectiveKind::ReduceScatter: return "reduce-scatter";
    case CollectiveKind::ReplicaAllReduce: return "replica all-reduce";
  }
  return "?";
}

int op_index(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::ForwardGather:
    case CollectiveKind::BackwardGather: return 0;
    case CollectiveKind::ReduceScatter: return 1;
    case CollectiveKind::ReplicaAllReduce: return 2;
  }
  return 0;
}

const CoreCosts& core_costs(const StepTimeSettings& s, const PlannedCollective& c) {
  return c.crosses_link ? s.link_cores : s.intra_cores;
}

double collective_seconds(const StepTimeSettings& s, const PlannedCollective& c, bool shared) {
  const double bw = std::max(1e-9, s.intra_busbw_gbps) * 1e9;
  const double sync = shared ? core_costs(s, c).sync_us[op_index(c.kind)] * 1e-6 : 0.0;
  return s.latency_us * 1e-6 * c.ring_steps + c.bytes * std::max(1.0, c.weight) / bw + sync;
}

double collective_core_seconds(const StepTimeSettings& s, const PlannedCollective& c) {
  const double bw = std::max(1e-9, s.intra_busbw_gbps) * 1e9;
  const CoreCosts& k = core_costs(s, c);
  const int op = op_index(c.kind);
  return std::min(collective_seconds(s, c, true), c.bytes * std::min(c.weight, k.weight[op]) / bw + k.sync_us[op] * 1e-6);
}

std::vector<UnitFlops> unit_flops_shares(const std::vector<fsdp::UnitPlan>& units) {
  std::vector<UnitFlops> out(units.size());
  double all = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    double numel = 0, trains = 0;
    for (const auto& f : units[i].flats) {
      numel += static_cast<double>(f.numel);
      if (!f.frozen) trains += static_cast<double>(f.numel);
    }
    out[i].fwd = 2 * numel;
    out[i].bwd = 2 * numel + 2 * trains;
    all += out[i].fwd + out[i].bwd;
  }
  for (auto& u : out) {
    u.fwd = all > 0 ? u.fwd / all : 0.0;
    u.bwd = all > 0 ? u.bwd / all : 0.0;
  }
  return out;
}

double recompute_flops_factor(const std::vector<fsdp::UnitPlan>& units) {
  const std::vector<UnitFlops> shares = unit_flops_shares(units);
  double blocks = 0;
  for (size_t i = 0; i < units.size(); ++i)
    if (!units[i].is_root() && !units[i].is_ignored()) blocks += shares[i].fwd;
  return 1.0 + blocks;
}

namespace {

// A FIFO channel: the collectives of a step run one after another on the link (and, with cores
// to spare, the copies).
struct Channel {
  double free_at = 0;
  double run(double issued, double seconds) {
    free_at = std::max(free_at, issued) + seconds;
    return free_at;
  }
};

}  // namespace

StepEstimate estimate_step(const StepTimeSettings& s, const StepTimeInputs& in) {
  StepEstimate e;
  const auto& units = *in.units;
  const auto& colls = *in.collectives;

  // Compute: the host's cores shared by its ranks' threads when they outnumber them.
  const int busy = std::max(1, in.ranks_per_host) * std::max(1, in.threads);
  const double share = s.cores_per_host > 0 && s.cores_per_host < busy ? static_cast<double>(s.cores_per_host) / busy : 1.0;
  e.shared_cores = share < 1.0;
  const double rate = s.compute_tflops * 1e12 * share;
  const double compute = rate > 0 ? in.step_flops / rate : 0.0;
  e.optimizer_s = rate > 0 ? s.optimizer_ns_per_param * 1e-9 * in.params_per_rank / share : 0.0;
  e.compute_s = compute + e.optimizer_s;

  // Seconds per (unit, kind) per micro-batch, and the step's all-reduces: whole, and the part
  // the cores spend (shared cores only; with cores to spare a free one does the copies).
  struct Time {
    double all = 0, core = 0;
  };
  std::map<std::pair<int, CollectiveKind>, Time> per_unit;
  Time replica;
  for (const auto& c : colls) {
    const double t = collective_seconds(s, c, e.shared_cores);
    const double k = e.shared_cores ? collective_core_seconds(s, c) : 0.0;
    const double n = c.kind == CollectiveKind::ReplicaAllReduce ? 1.0 : c.per_micro;
    Time& slot = c.kind == CollectiveKind::ReplicaAllReduce ? replica : per_unit[{c.unit, c.kind}];
    slot.all += t * n;
    slot.core += k * n;
    const double per_step = c.kind == CollectiveKind::ReplicaAllReduce ? 1.0 : n * in.grad_accum;
    e.comm_s += t * per_step;
    e.comm_core_s += k * per_step;
  }
  if (compute <= 0) {  // nothing to hide behind
    e.exposed_s = e.comm_s;
    return e;
  }
  auto coll = [&](int u, CollectiveKind k) {
    auto it = per_unit.find({u, k});
    return it == per_unit.end() ? Time{} : it->second;
  };

  // The units in forward order: the root (its forward wraps the blocks; its FLOPs, the head's,
  // come after them), then the blocks; the ignored group's FLOPs go with the root.
  int root = -1;
  std::vector<int> blocks;
  for (size_t i = 0; i < units.size(); ++i) {
    if (units[i].is_root()) root = static_cast<int>(i);
    else if (!units[i].is_ignored()) blocks.push_back(static_cast<int>(i));
  }
  const double per_micro = compute / std::max(1, in.grad_accum);
  // Each unit's forward and backward shares of the weights' FLOPs (unit_flops_shares: forward 2,
  // backward 4 per trainable parameter and 2 per frozen one); the ignored group's go with the
  // root. Recomputation runs a block's forward again in its backward, which step_flops already
  // counts (recompute_flops_factor): split it the same way.
  std::vector<UnitFlops> unit_share = unit_flops_shares(units);
  for (size_t i = 0; i < units.size(); ++i)
    if (units[i].is_ignored() && root >= 0) {
      unit_share[root].fwd += unit_share[i].fwd;
      unit_share[root].bwd += unit_share[i].bwd;
    }
  const double denom = in.recompute ? recompute_flops_factor(units) : 1.0;  // step_flops = base x denom
  auto fwd = [&](int u) { return per_micro * unit_share[u].fwd / denom; };
  auto bwd = [&](int u) {
    return per_micro * (unit_share[u].bwd + (in.recompute && u != root ? unit_share[u].fwd : 0.0)) / denom;
  };

  Channel ch;
  double t = 0;
  std::map<int, double> gather_done;  // unit -> when its gather in flight finishes
  // Issuing a collective: its core part runs on the compute stream (shared cores), the rest on
  // the channel.
  auto issue = [&](const Time& d) {
    t += d.core;
    return ch.run(t, d.all - d.core);
  };
  auto issue_gather = [&](int u, CollectiveKind k) {
    if (u < 0 || gather_done.count(u)) return;
    const Time d = coll(u, k);
    if (d.all > 0) gather_done[u] = issue(d);
  };
  auto wait_gather = [&](int u) {
    auto it = gather_done.find(u);
    if (it == gather_done.end()) return;
    t = std::max(t, it->second);
    gather_done.erase(it);
  };
  const bool reshard = fsdp::reshards_after_forward(in.strategy);
  for (int mb = 0; mb < std::max(1, in.grad_accum); ++mb) {
    // forward: root, then the blocks, each waited before it runs.
    std::vector<int> order;
    if (root >= 0) order.push_back(root);
    order.insert(order.end(), blocks.begin(), blocks.end());
    for (size_t i = 0; i < order.size(); ++i) {
      issue_gather(order[i], CollectiveKind::ForwardGather);
      wait_gather(order[i]);
      if (in.forward_prefetch && i + 1 < order.size()) issue_gather(order[i + 1], CollectiveKind::ForwardGather);
      if (order[i] != root) t += fwd(order[i]);
    }
    if (root >= 0) t += fwd(root);
    // backward: the head (root), the blocks last to first, then the root's reduce-scatter.
    if (root >= 0) t += bwd(root) / 2;  // the head's half; the embedding's after the blocks
    std::deque<double> pending;
    auto reduce = [&](int u) {
      const Time d = coll(u, CollectiveKind::ReduceScatter);
      if (d.all <= 0) return;
      pending.push_back(issue(d));
      while (pending.size() > fsdp::kMaxPendingReductions) {
        t = std::max(t, pending.front());
        pending.pop_front();
      }
    };
    for (size_t j = blocks.size(); j-- > 0;) {
      const int u = blocks[j];
      const int next = j > 0 ? blocks[j - 1] : -1;
      if (reshard) {
        issue_gather(u, CollectiveKind::BackwardGather);
        wait_gather(u);
        if (in.backward_prefetch == fsdp::BackwardPrefetch::Pre) issue_gather(next, CollectiveKind::BackwardGather);
      }
      t += bwd(u);
      reduce(u);
      if (reshard && in.backward_prefetch == fsdp::BackwardPrefetch::Post) issue_gather(next, CollectiveKind::BackwardGather);
    }
    if (root >= 0) {
      t += bwd(root) / 2;
      reduce(root);
    }
    for (double p : pending) t = std::max(t, p);
  }
  t = std::max(t, ch.free_at) + replica.all;  // the replica average waits for everything before it
  t += e.optimizer_s;
  e.exposed_s = std::max(0.0, t - e.compute_s);
  return e;
}

void add_outer_sync(const StepTimeSettings& s, const std::vector<PlannedCollective>& fragments, int inner_steps,
                    int overlap_steps, StepEstimate* e) {
  const double H = std::max(1, inner_steps);
  // The compute a fragment's sync can run behind: the next tau inner steps (their own
  // collectives stay inside the hosts, on another channel than the link).
  const double behind = std::max(0, overlap_steps) * e->compute_s;
  double all = 0, exposed = 0;
  for (const auto& c : fragments) {
    const double t = collective_seconds(s, c, e->shared_cores);
    const double core = e->shared_cores ? collective_core_seconds(s, c) : 0.0;
    all += t;
    exposed += overlap_steps > 0 ? std::max(core, t - behind) : t;
  }
  e->outer_comm_s = all / H;
  e->outer_exposed_s = exposed / H;
  e->comm_s += e->outer_comm_s;
  e->exposed_s += e->outer_exposed_s;
}

}  // namespace shardtrain::plan
