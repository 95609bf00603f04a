// When the engine communicates: the unit transitions (pre/post forward, pre/post backward, end of
// backward) and the gather / reshard / reduce mechanics they use, with the bounds on what is in
// flight (limit_all_gathers, kMaxPendingReductions, kMaxPendingCopies).
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>

#include "collectives.h"
#include "engine_impl.h"
#include "recompute.h"
#include "zeropp.h"
#include "shardtrain/fsdp/nf4_shard.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/timer.h"
#include "shardtrain/util/torch_compat.h"

namespace shardtrain::fsdp {
namespace {

// A host->device copy on the side stream, as a Work: wait() orders the compute stream after it.
class CopyWork final : public comm::Work {
 public:
  CopyWork(DeviceRuntime& dev, DeviceEventPtr done) : Work(0), dev_(dev), done_(std::move(done)) {}
  void wait() override { dev_.compute_waits(done_); }
  bool is_completed() override { return done_->query(); }

 private:
  DeviceRuntime& dev_;
  DeviceEventPtr done_;
};

}  // namespace

const char* to_string(UnitState s) {
  switch (s) {
    case UnitState::Idle: return "idle";
    case UnitState::Forward: return "forward";
    case UnitState::PreBackward: return "pre-backward";
    case UnitState::PostBackward: return "post-backward";
  }
  return "?";
}

// ---- unshard / reshard -----------------------------------------------------------
void Engine::Impl::track_live() {
  int64_t live = 0;
  for (auto& u : units)
    for (auto& fp : u->flats)
      if (!fp->aliases_master()) live += fp->live_full_bytes();
  stats.live_unsharded_bytes = live;
  stats.peak_unsharded_bytes = std::max(stats.peak_unsharded_bytes, live);
}

void Engine::Impl::wait_timed(comm::Work& w) {
  double t0 = now_seconds();
  w.wait();
  stats.exposed_comm_seconds += now_seconds() - t0;
}

void Engine::Impl::wait_gather(FlatParam& fp) {
  comm::WorkPtr w = fp.take_gather_work();
  if (!w) return;
  wait_timed(*w);
  inflight.erase(std::remove(inflight.begin(), inflight.end(), &fp), inflight.end());
}

void Engine::Impl::issue_gather(Unit& u, FlatParam& fp) {
  if (!fp.needs_gather()) return;  // gathering, or unsharded and current
  if (!fp.aliases_master())
    while (static_cast<int>(inflight.size()) >= opts.limit_all_gathers) wait_gather(*inflight.front());
  at::Tensor mine = fp.begin_fill();
  if (!mine.defined()) return;  // aliases its master: nothing to gather
  track_live();
  if (fp.nf4()) {
    // QLoRA's base: the codes and statistics travel, every rank dequantizes every slice (its own
    // too) into the compute dtype.
    if (fp.shard_size() == 1) {
      nf4::dequantize_shard(fp.packed().to(mine.device()), fp.shard_numel(), fp.nf4_format(), mine);
      fp.filled();
      return;
    }
    fp.gathering(nf4_all_gather_flat(*u.shard, fp));
  } else if (fp.offloaded() && dev->is_cuda()) {
    // Host shard -> device on the side stream (after the compute stream's last use of the
    // new block), so the copy overlaps computation; the all-gather is ordered after it.
    dev->side_waits_compute();
    {
      DeviceRuntime::SideScope side(*dev);
      mine.copy_(fp.master(), /*non_blocking=*/true);
    }
    if (fp.shard_size() == 1) {
      fp.gathering(std::make_shared<CopyWork>(*dev, dev->record_on_side()));
    } else {
      comm::ComputeStreamGuard after_copy(dev->side_stream());
      fp.gathering(all_gather_flat(*u.shard, fp, mine));
    }
  } else {
    mine.copy_(fp.master());
    if (fp.shard_size() == 1) {
      fp.filled();
      return;
    }
    fp.gathering(gather_flat(u, fp, mine));
  }
  inflight.push_back(&fp);
  stats.max_all_gathers_in_flight = std::max(stats.max_all_gathers_in_flight, static_cast<int>(inflight.size()));
}

comm::WorkPtr Engine::Impl::gather_flat(Unit& u, FlatParam& fp, const at::Tensor& mine) {
  if (!zpp) return all_gather_flat(*u.shard, fp, mine);
  return zpp->gather(*u.shard, fp, mine, u.kind != UnitKind::Ignored, phase == Phase::Backward, stats);
}

void Engine::Impl::issue_unshard(Unit& u) {
  for (auto& fp : u.flats) issue_gather(u, *fp);
}

void Engine::Impl::unshard(Unit& u) {
  issue_unshard(u);
  for (auto& fp : u.flats) wait_gather(*fp);
}

void Engine::Impl::reshard(Unit& u) {
  for (auto& fp : u.flats) {
    if (fp->aliases_master()) continue;
    wait_gather(*fp);  // never free memory a collective is writing
    fp->release();
  }
  track_live();
}

Unit* Engine::Impl::backward_successor(const Unit& u) const {
  // Backward runs units in reverse forward order; the root (index 0) stays unsharded.
  if (!order.recorded || u.order_index <= 1) return nullptr;
  return order.units[u.order_index - 1];
}

// ---- forward ---------------------------------------------------------------------
at::Tensor Engine::Impl::run_forward(Unit& u, const at::Tensor& input, const UnitBody& body) {
  Scope scope(*this);
  ST_CHECK(u.state != UnitState::Forward, "unit '", u.name, "': forward entered again from inside its own forward");
  // pre-forward. The state returns to what it was however the forward ends (maxbatch catches
  // an out-of-memory error in a forward and tries again).
  struct Restore {
    Unit& u;
    UnitState before;
    ~Restore() { u.state = before; }
  } restore{u, u.state};
  u.state = UnitState::Forward;
  if (!order.recorded && u.order_index < 0) {
    u.order_index = static_cast<int>(order.units.size());
    order.units.push_back(&u);
  }
  // Ignored parameters are kept whole; offloaded, their device copy is refreshed from the
  // host master before the model's forward (the root's) whenever the optimizer changed it.
  if (u.kind == UnitKind::Root && ignored) unshard(*ignored);
  unshard(u);
  if (opts.forward_prefetch && order.recorded && u.order_index + 1 < static_cast<int>(order.units.size()))
    issue_unshard(*order.units[u.order_index + 1]);
  at::Tensor x = input;
  if (x.defined() && x.is_floating_point() && x.scalar_type() != opts.mp.param_dtype) x = x.to(opts.mp.param_dtype);
  const bool grad = torch::autograd::GradMode::is_enabled();
  if (grad && u.has_frozen && u.kind != UnitKind::Root && x.defined() && x.requires_grad()) {
    // Frozen weights carry the gradient to the input after the trainable ones may all have
    // landed: post_backward waits for the input's gradient too (unit.h).
    u.awaits_input = true;
    Unit* up = &u;
    x.register_hook([this, up](const at::Tensor&) {
      Scope scope(*this);
      up->awaits_input = false;
      if (up->grads_landed >= up->num_params) post_backward(*up);
    });
  }
  // Recomputation only where backward will run: a unit with nothing that trains whose input needs
  // no gradient (frozen layers below everything that trains) builds no graph at all.
  const bool backward_runs = x.defined() && (x.requires_grad() || u.num_params > 0);
  at::Tensor out = (opts.activation_checkpointing && u.kind != UnitKind::Root && grad && backward_runs && x.is_floating_point())
                       ? run_with_recompute(x, body)
                       : body(x);
  // post-forward
  if (u.kind == UnitKind::Root) {
    order.recorded = true;
    if (!grad) {
      // Evaluation: no backward will come to reshard, so do it now.
      for (auto& v : units)
        if (v->reshard_after_backward && v->kind != UnitKind::Ignored) reshard(*v);
    }
  } else if (u.reshard_after_forward && grad) {
    // hpZ: the node's shard of what forward used.
    if (zpp && u.kind != UnitKind::Ignored) zpp->keep_secondary(u.flats, stats);
    reshard(u);
  } else if (!grad && u.reshard_after_backward) {
    reshard(u);
  }
  if (out.defined() && out.requires_grad()) {
    Unit* up = &u;
    out.register_hook([this, up](const at::Tensor&) {
      Scope scope(*this);
      pre_backward(*up);
    });
  }
  return out;
}

// ---- backward --------------------------------------------------------------------
void Engine::Impl::begin_backward() {
  phase = Phase::Backward;
  torch_compat::queue_backward_callback([this] {
    Scope scope(*this);
    end_backward();
  });
  if (ignored) prepare_grads(*ignored);
}

// Idle -> PreBackward: unsharded gradient buffers (or the gradient shard itself, for a flat
// that aliases its master) become the parameters' .grad, so AccumulateGrad sums into them.
void Engine::Impl::prepare_grads(Unit& u) {
  if (u.state == UnitState::PreBackward || u.state == UnitState::PostBackward) return;
  u.full_grads.assign(u.flats.size(), at::Tensor());
  for (size_t i = 0; i < u.flats.size(); ++i) {
    FlatParam& fp = *u.flats[i];
    if (fp.frozen()) continue;  // no gradient buffer
    at::Tensor buf;
    if (fp.aliases_master() && !opts.reproducible) {
      buf = fp.grad_shard();  // local accumulation straight into the fp32 gradient
    } else {
      buf = at::zeros({fp.padded()}, fp.full().options());
      u.full_grads[i] = buf;
      stats.live_grad_buffer_bytes += fp.full_bytes();
    }
    for (auto& s : fp.slots()) s.param.mutable_grad() = storage_alias(buf, s.offset, s.shape);
  }
  stats.peak_grad_buffer_bytes = std::max(stats.peak_grad_buffer_bytes, stats.live_grad_buffer_bytes);
  u.state = UnitState::PreBackward;
  u.grads_landed = 0;
}

void Engine::Impl::pre_backward(Unit& u) {
  if (phase == Phase::Idle) begin_backward();
  // A root in which nothing trains (LoRA's frozen embedding, norm and head) has no gradient to
  // wait for: its backward (the head's input gradient) is over once the gradient reaches a
  // block, so it is resharded now instead of at the end of backward (a 70B model's embedding
  // and head are 1 GB of bf16 held through every block's backward otherwise).
  Unit& root = *units.front();
  if (u.kind != UnitKind::Root && root.kind == UnitKind::Root && root.num_params == 0 && !root.awaits_input)
    post_backward(root);
  unshard(u);
  prepare_grads(u);
  if (opts.backward_prefetch == BackwardPrefetch::Pre)
    if (Unit* next = backward_successor(u)) issue_unshard(*next);
}

void Engine::Impl::on_param_ready(Unit& u) {
  Scope scope(*this);
  ST_CHECK(u.state == UnitState::PreBackward || u.state == UnitState::PostBackward, "a parameter of unit '", u.name,
           "' received a gradient outside that unit's backward: is it used outside its unit?");
  if (++u.grads_landed == u.num_params && !u.awaits_input) post_backward(u);
}

// PreBackward -> PostBackward (any other state: nothing to do).
void Engine::Impl::post_backward(Unit& u) {
  if (u.state != UnitState::PreBackward) return;
  for (size_t i = 0; i < u.flats.size(); ++i) reduce(u, i);
  for (auto& fp : u.flats)
    for (auto& s : fp->slots()) s.param.mutable_grad().reset();
  u.state = UnitState::PostBackward;
  if (u.reshard_after_backward && u.kind != UnitKind::Ignored) reshard(u);
  if (opts.backward_prefetch == BackwardPrefetch::Post)
    if (Unit* next = backward_successor(u)) issue_unshard(*next);
}

void Engine::Impl::reduce(Unit& u, size_t i) {
  FlatParam& fp = *u.flats[i];
  if (!u.full_grads[i].defined()) return;  // accumulated in place
  if (fp.shard_size() == 1) {
    at::Tensor in;
    {
      at::Tensor g = std::move(u.full_grads[i]);  // the compute-dtype buffer goes once cast
      in = g.scalar_type() == opts.mp.reduce_dtype ? g : g.to(opts.mp.reduce_dtype);
    }
    if (opts.reproducible && u.shard_rs && u.shard_rs->size() > 1) {
      // A whole flat (the ignored group) in a sharded strategy: its leaves' sum over the shard
      // group, the same level of the tree the other flats' reduce-scatters are.
      pending.push_back({&fp, sum_whole_grad_tree(*u.shard_rs, in), in, in});
      retire_reductions(kMaxPendingReductions);
      return;
    }
    accumulate(fp, in);
    stats.live_grad_buffer_bytes -= fp.full_bytes();
    return;
  }
  ReduceScatter r = reduce_scatter_grad(u.shard_rs ? *u.shard_rs : *u.shard, std::move(u.full_grads[i]),
                                        opts.mp.reduce_dtype, fp.shard_numel(), opts.reproducible);
  pending.push_back({&fp, std::move(r.work), std::move(r.out), std::move(r.in)});
  // Unsharded gradient buffers live until their reduce-scatter is retired: wait for the
  // oldest beyond a few, so backward holds a bounded number of them instead of the whole
  // model's.
  retire_reductions(kMaxPendingReductions);
}

void Engine::Impl::retire(PendingReduce& p) {
  wait_timed(*p.work);
  accumulate(*p.fp, p.out);
  stats.live_grad_buffer_bytes -= p.fp->full_bytes();
  p = PendingReduce{};
}

// Retires reductions in issue order until at most `keep` remain. Only the count decides,
// never whether one has already completed: then which buffers are alive at each point of
// backward, and so the peak, is the same in every run (the memory planner's bound, and what
// `maxbatch` measures), not a race with the communication thread.
void Engine::Impl::retire_reductions(size_t keep) {
  size_t done = 0;
  while (pending.size() - done > keep) retire(pending[done++]);
  pending.erase(pending.begin(), pending.begin() + done);
}

// Adds a reduced gradient [L] into the flat's gradient shard: at once, or, when the shard is
// offloaded, through a device->host copy on the side stream that drain_d2h() finishes.
void Engine::Impl::accumulate(FlatParam& fp, const at::Tensor& reduced) {
  if (!fp.offloaded()) {
    absorb(fp, reduced);
    return;
  }
  PendingD2H d;
  d.fp = &fp;
  if (dev->is_cuda()) {
    dev->side_waits_compute();  // `reduced` is final on the compute stream
    d.source = reduced;
    // Pinned (a tensor's options() do not carry that), so the copy is asynchronous.
    d.staging = at::empty({reduced.numel()}, fp.grad_shard().options().pinned_memory(true));
    {
      DeviceRuntime::SideScope side(*dev);
      d.staging.copy_(reduced, /*non_blocking=*/true);
    }
    d.done = dev->record_on_side();
  } else {
    d.staging = reduced;
    d.done = dev->record_on_side();  // complete
  }
  d2h.push_back(std::move(d));
  drain_d2h(kMaxPendingCopies);
}

// Adds device->host gradient copies into their shards, in issue order, waiting for each,
// until at most `keep` remain (by count only, as retire_reductions).
void Engine::Impl::drain_d2h(size_t keep) {
  while (d2h.size() > keep) {
    PendingD2H& d = d2h.front();
    double t0 = now_seconds();
    d.done->synchronize();
    stats.exposed_comm_seconds += now_seconds() - t0;
    absorb(*d.fp, d.staging);
    d2h.pop_front();
  }
}

void Engine::Impl::absorb(FlatParam& fp, const at::Tensor& reduced) {
  if (!opts.reproducible) {
    fp.grad_shard().add_(reduced);
    return;
  }
  // The reduced tensor is the engine's own (a reduce-scatter's output, a cast or the leaf's
  // buffer): it becomes a partial sum without a copy.
  leaf_sums[&fp].push(reduced.scalar_type() == at::kFloat ? reduced : reduced.to(at::kFloat));
}

void Engine::Impl::finish_leaf_sums() {
  for (auto& u : units)
    for (auto& fp : u->flats) {
      if (fp->frozen()) continue;
      LeafSum& ls = leaf_sums[fp.get()];
      const int64_t leaves = ls.pushes();
      at::Tensor total = ls.take();
      ST_CHECK(total.defined(), "unit '", u->name, "': ", leaves,
               " leaf gradients this step, not a power of two (train.reproducible's plan is checked at start-up)");
      fp->grad_shard().copy_(total);
    }
}

// The tensor itself when it already lives where the flat's collectives run (its `full`'s
// device); else a device copy (offloaded shards on CUDA: NCCL reduces device memory).
at::Tensor Engine::Impl::on_comm_device(const FlatParam& fp, const at::Tensor& t) const {
  if (t.device() == fp.full().device()) return t;
  return t.to(fp.full().device());
}

void Engine::Impl::end_backward() {
  // Units whose parameters did not all receive gradients (unused this step).
  for (auto& u : units) post_backward(*u);
  retire_reductions(0);
  drain_d2h(0);
  if (opts.cpu_offload && dev->is_cuda()) {
    // Every host->device copy of the masters has finished before the host optimizer
    // writes them.
    dev->record_on_side()->synchronize();
  }
  if (last_micro) {
    if (opts.reproducible) finish_leaf_sums();
    if (opts.reproducible && opts.replica_sync.diloco() && comms.replicate && comms.replicate->size() > 1) {
      // DiLoCo: the trainer scales each leaf's loss by 1 / (the global batch's leaves), and this
      // replica summed only its own 1 / R of them: times R (a power of two, so exact) is its mean.
      for (auto& u : units)
        for (auto& fp : u->flats)
          if (!fp->frozen()) fp->grad_shard().mul_(static_cast<double>(comms.replicate->size()));
    }
    std::vector<std::pair<comm::Comm*, FlatParam*>> shards;
    for (auto& u : units)
      for (auto& fp : u->flats)
        if (!fp->frozen()) shards.emplace_back(u->replicate, fp.get());
    if (zpp) zpp->issue_replica_average(shards);  // ZeRO++ qgZ: takes the flats it averages out of `shards`
    ReplicaAverage avg = average_across_replicas(
        shards, [this](const FlatParam& fp) { return on_comm_device(fp, fp.grad_shard()); }, opts.reproducible);
    for (auto& w : avg.works) wait_timed(*w);
    avg.finish();
    if (zpp) zpp->finish_replica_average(comms.shard, [this](comm::Work& w) { wait_timed(w); });
  }
  for (auto& u : units) {
    if (u->reshard_after_backward && u->kind != UnitKind::Ignored) reshard(*u);
    u->state = UnitState::Idle;
    u->grads_landed = 0;
    u->awaits_input = false;
  }
  phase = Phase::Idle;
}

}  // namespace shardtrain::fsdp
