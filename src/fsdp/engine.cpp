// Engine: wrapping (units, flat params, sharded init) and the unshard/reshard/reduce
// machinery driven by forward hooks, tensor hooks and AccumulateGrad post hooks.
#include "shardtrain/fsdp/engine.h"

#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <deque>

#include "recompute.h"
#include "shardtrain/comm/compute_stream.h"
#include "shardtrain/fsdp/device.h"
#include "shardtrain/fsdp/forward_hook.h"
#include "shardtrain/fsdp/wrap.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/timer.h"
#include "shardtrain/util/torch_compat.h"

namespace shardtrain::fsdp {
namespace {

// Module::parameters_ is protected; the engine must swap meta parameters for real ones
// in place (same dict entry) so the model keeps working unchanged.
struct ModuleAccess : torch::nn::Module {
  static torch::OrderedDict<std::string, at::Tensor>& params(torch::nn::Module& m) {
    return m.*(&ModuleAccess::parameters_);
  }
};

int group_size(const comm::Comm* c) { return c ? c->size() : 1; }
int group_rank(const comm::Comm* c) { return c ? c->rank() : 0; }

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

// One FSDP unit: a hookable module and the parameters it claims, in 1-2 FlatParams
// (compute dtype, and fp32 for keep_fp32 parameters under mixed precision).
struct Unit {
  std::string name;
  torch::nn::Module* module = nullptr;
  Hookable* hookable = nullptr;
  bool is_root = false, is_ignored = false;
  bool reshard_after_forward = false, reshard_after_backward = true;
  comm::Comm* shard = nullptr;      // all-gathers
  comm::Comm* shard_rs = nullptr;   // reduce-scatters
  comm::Comm* replicate = nullptr;  // cross-replica gradient average
  std::vector<std::unique_ptr<FlatParam>> flats;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // keep alive (weakly held)
  int num_params = 0;
  int order_index = -1;
  // Per-backward state.
  bool grads_prepared = false, finished = false;
  int ready = 0;
  std::vector<at::Tensor> full_grads;  // per flat; undefined when gradients land in grad_shard
};

struct PendingReduce {
  FlatParam* fp = nullptr;
  comm::WorkPtr work;
  at::Tensor out, in;
};

// A reduced gradient on its way into an offloaded (host) gradient shard. On CUDA: `source` is
// the device tensor, `staging` its pinned host copy made on the side stream, `done` that copy's
// event; the source stays referenced until `done` completes (no recordStream). On a CPU device
// `staging` is the reduced tensor itself and `done` is complete at once.
struct PendingD2H {
  FlatParam* fp = nullptr;
  at::Tensor source, staging;
  DeviceEventPtr done;
};

struct Engine::Impl {
  EngineComms comms;
  EngineOptions opts;
  std::vector<std::unique_ptr<Unit>> units;  // root first, ignored group last (if any)
  std::vector<UnitPlan> layout;              // what they were built from, one plan per unit
  Unit* ignored = nullptr;
  std::vector<Unit*> exec_order;             // forward order, recorded in the first forward
  bool order_recorded = false;
  std::deque<FlatParam*> inflight;           // issued all-gathers not yet waited
  bool in_backward = false, last_micro = true;
  std::vector<PendingReduce> pending;
  std::deque<PendingD2H> d2h;
  std::unique_ptr<DeviceRuntime> dev;
  MemoryStats stats;

  // Every entry from a hook or the API: NCCL collectives are ordered after torch's current
  // stream on this thread (autograd runs CUDA backward on its own device thread), and new
  // storages come from the engine's device.
  struct Scope {
    c10::OptionalDeviceGuard device;
    comm::ComputeStreamGuard stream;
    explicit Scope(Impl& m)
        : device(m.dev->is_cuda() ? c10::optional<c10::Device>(m.dev->device()) : c10::nullopt),
          stream(m.dev->compute_stream()) {}
  };

  // ---- unshard / reshard ---------------------------------------------------------
  void track_live() {
    int64_t live = 0;
    for (auto& u : units)
      for (auto& fp : u->flats)
        if (!fp->aliases_master()) live += fp->live_full_bytes();
    stats.live_unsharded_bytes = live;
    stats.peak_unsharded_bytes = std::max(stats.peak_unsharded_bytes, live);
  }

  // Time the training thread spends blocked on collectives: the communication that
  // computation did not hide.
  void wait_timed(comm::Work& w) {
    double t0 = now_seconds();
    w.wait();
    stats.exposed_comm_seconds += now_seconds() - t0;
  }

  void wait_gather(FlatParam& fp) {
    if (fp.state != FlatParam::State::Gathering) return;
    wait_timed(*fp.gather_work);
    fp.gather_work.reset();
    fp.state = FlatParam::State::Unsharded;
    inflight.erase(std::remove(inflight.begin(), inflight.end(), &fp), inflight.end());
  }

  void issue_gather(Unit& u, FlatParam& fp) {
    if (fp.state == FlatParam::State::Gathering) return;
    if (fp.state == FlatParam::State::Unsharded && !fp.stale) return;
    if (fp.aliases_master()) {
      fp.state = FlatParam::State::Unsharded;
      fp.stale = false;
      return;
    }
    while (static_cast<int>(inflight.size()) >= opts.limit_all_gathers) wait_gather(*inflight.front());
    resize_storage(fp.full, fp.full_bytes());  // on the compute stream
    track_live();
    at::Tensor mine = storage_alias(fp.full, fp.shard_rank * fp.shard_numel, {fp.shard_numel});
    fp.stale = false;
    if (fp.offloaded && dev->is_cuda()) {
      // Host shard -> device on the side stream (after the compute stream's last use of the
      // new block), so the copy overlaps computation; the all-gather is ordered after it.
      dev->side_waits_compute();
      {
        DeviceRuntime::SideScope side(*dev);
        mine.copy_(fp.master, /*non_blocking=*/true);
      }
      if (fp.shard_size == 1) {
        fp.gather_work = std::make_shared<CopyWork>(*dev, dev->record_on_side());
      } else {
        comm::ComputeStreamGuard after_copy(dev->side_stream());
        fp.gather_work = u.shard->all_gather(storage_alias(fp.full, 0, {fp.padded}), mine);
      }
    } else {
      mine.copy_(fp.master);
      if (fp.shard_size == 1) {
        fp.state = FlatParam::State::Unsharded;
        return;
      }
      fp.gather_work = u.shard->all_gather(storage_alias(fp.full, 0, {fp.padded}), mine);
    }
    fp.state = FlatParam::State::Gathering;
    inflight.push_back(&fp);
    stats.max_all_gathers_in_flight = std::max(stats.max_all_gathers_in_flight, static_cast<int>(inflight.size()));
  }

  void issue_unshard(Unit& u) {
    for (auto& fp : u.flats) issue_gather(u, *fp);
  }
  void unshard(Unit& u) {
    issue_unshard(u);
    for (auto& fp : u.flats) wait_gather(*fp);
  }
  void reshard(Unit& u) {
    for (auto& fp : u.flats) {
      if (fp->aliases_master()) continue;
      wait_gather(*fp);  // never free memory a collective is writing
      resize_storage(fp->full, 0);
      fp->state = FlatParam::State::Sharded;
    }
    track_live();
  }

  Unit* backward_successor(const Unit& u) const {
    // Backward runs units in reverse forward order; the root (index 0) stays unsharded.
    if (!order_recorded || u.order_index <= 1) return nullptr;
    return exec_order[u.order_index - 1];
  }

  // ---- forward ---------------------------------------------------------------------
  at::Tensor run_forward(Unit& u, const at::Tensor& input, const UnitBody& body) {
    Scope scope(*this);
    if (!order_recorded && u.order_index < 0) {
      u.order_index = static_cast<int>(exec_order.size());
      exec_order.push_back(&u);
    }
    // Ignored parameters are kept whole; offloaded, their device copy is refreshed from the
    // host master before the model's forward (the root's) whenever the optimizer changed it.
    if (u.is_root && ignored) unshard(*ignored);
    unshard(u);
    if (opts.forward_prefetch && order_recorded && u.order_index + 1 < static_cast<int>(exec_order.size()))
      issue_unshard(*exec_order[u.order_index + 1]);
    at::Tensor x = input;
    if (x.defined() && x.is_floating_point() && x.scalar_type() != opts.mp.param_dtype)
      x = x.to(opts.mp.param_dtype);
    const bool grad = torch::autograd::GradMode::is_enabled();
    at::Tensor out = (opts.activation_checkpointing && !u.is_root && grad && x.defined() && x.is_floating_point())
                         ? run_with_recompute(x, body)
                         : body(x);
    if (u.is_root) {
      order_recorded = true;
      if (!grad) {
        // Evaluation: no backward will come to reshard, so do it now.
        for (auto& v : units)
          if (v->reshard_after_backward && !v->is_ignored) reshard(*v);
      }
    } else if (u.reshard_after_forward && grad) {
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
  void begin_backward() {
    in_backward = true;
    torch_compat::queue_backward_callback([this] {
      Scope scope(*this);
      end_backward();
    });
    if (ignored) prepare_grads(*ignored);
  }

  void prepare_grads(Unit& u) {
    if (u.grads_prepared) return;
    u.full_grads.assign(u.flats.size(), at::Tensor());
    for (size_t i = 0; i < u.flats.size(); ++i) {
      FlatParam& fp = *u.flats[i];
      at::Tensor buf;
      if (fp.aliases_master()) {
        buf = fp.grad_shard;  // local accumulation straight into the fp32 gradient
      } else {
        buf = at::zeros({fp.padded}, fp.full.options());
        u.full_grads[i] = buf;
        stats.live_grad_buffer_bytes += fp.full_bytes();
      }
      for (auto& s : fp.slots) s.param.mutable_grad() = storage_alias(buf, s.offset, s.shape);
    }
    stats.peak_grad_buffer_bytes = std::max(stats.peak_grad_buffer_bytes, stats.live_grad_buffer_bytes);
    u.grads_prepared = true;
    u.finished = false;
    u.ready = 0;
  }

  void pre_backward(Unit& u) {
    if (!in_backward) begin_backward();
    unshard(u);
    prepare_grads(u);
    if (opts.backward_prefetch == BackwardPrefetch::Pre)
      if (Unit* next = backward_successor(u)) issue_unshard(*next);
  }

  void on_param_ready(Unit& u) {
    Scope scope(*this);
    ST_CHECK(u.grads_prepared, "a parameter of unit '", u.name,
             "' received a gradient outside that unit's backward: is it used outside its unit?");
    if (++u.ready == u.num_params) finish_unit(u);
  }

  void reduce(Unit& u, size_t i) {
    FlatParam& fp = *u.flats[i];
    at::Tensor full_grad = u.full_grads[i];
    u.full_grads[i] = at::Tensor();
    if (!full_grad.defined()) return;  // accumulated in place
    at::Tensor in = full_grad.scalar_type() == opts.mp.reduce_dtype ? full_grad : full_grad.to(opts.mp.reduce_dtype);
    full_grad = at::Tensor();
    if (fp.shard_size == 1) {
      accumulate(fp, in);
      stats.live_grad_buffer_bytes -= fp.full_bytes();
      return;
    }
    at::Tensor out = at::empty({fp.shard_numel}, in.options());
    comm::Comm* c = u.shard_rs ? u.shard_rs : u.shard;
    pending.push_back({&fp, c->reduce_scatter(out, in, comm::ReduceOp::Avg), out, in});
    // Unsharded gradient buffers live until their reduce-scatter is retired: wait for the
    // oldest beyond a few, so backward holds a bounded number of them instead of the whole
    // model's.
    retire_reductions(kMaxPendingReductions);
  }

  void retire(PendingReduce& p) {
    wait_timed(*p.work);
    accumulate(*p.fp, p.out);
    stats.live_grad_buffer_bytes -= p.fp->full_bytes();
    p = PendingReduce{};
  }

  // Adds a reduced gradient [L] into the flat's gradient shard: at once, or, when the shard is
  // offloaded, through a device->host copy on the side stream that drain_d2h() finishes.
  void accumulate(FlatParam& fp, const at::Tensor& reduced) {
    if (!fp.offloaded) {
      fp.grad_shard.add_(reduced);
      return;
    }
    PendingD2H d;
    d.fp = &fp;
    if (dev->is_cuda()) {
      dev->side_waits_compute();  // `reduced` is final on the compute stream
      d.source = reduced;
      // Pinned (a tensor's options() do not carry that), so the copy is asynchronous.
      d.staging = at::empty({reduced.numel()}, fp.grad_shard.options().pinned_memory(true));
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
  void drain_d2h(size_t keep) {
    while (d2h.size() > keep) {
      PendingD2H& d = d2h.front();
      double t0 = now_seconds();
      d.done->synchronize();
      stats.exposed_comm_seconds += now_seconds() - t0;
      d.fp->grad_shard.add_(d.staging);
      d2h.pop_front();
    }
  }

  // Retires reductions in issue order until at most `keep` remain. Only the count decides,
  // never whether one has already completed: then which buffers are alive at each point of
  // backward, and so the peak, is the same in every run (the memory planner's bound, and what
  // `maxbatch` measures), not a race with the communication thread.
  void retire_reductions(size_t keep) {
    size_t done = 0;
    while (pending.size() - done > keep)
      retire(pending[done++]);
    pending.erase(pending.begin(), pending.begin() + done);
  }

  void finish_unit(Unit& u) {
    if (u.finished || !u.grads_prepared) return;
    for (size_t i = 0; i < u.flats.size(); ++i) reduce(u, i);
    for (auto& fp : u.flats)
      for (auto& s : fp->slots) s.param.mutable_grad().reset();
    u.finished = true;
    if (u.reshard_after_backward && !u.is_ignored) reshard(u);
    if (opts.backward_prefetch == BackwardPrefetch::Post)
      if (Unit* next = backward_successor(u)) issue_unshard(*next);
  }

  // The tensor itself when it already lives where the flat's collectives run (its `full`'s
  // device); else a device copy (offloaded shards on CUDA: NCCL reduces device memory).
  at::Tensor on_comm_device(const FlatParam& fp, const at::Tensor& t) const {
    if (t.device() == fp.full.device()) return t;
    return t.to(fp.full.device());
  }

  void end_backward() {
    // Units whose parameters did not all receive gradients (unused this step).
    for (auto& u : units) finish_unit(*u);
    retire_reductions(0);
    drain_d2h(0);
    if (opts.cpu_offload && dev->is_cuda()) {
      // Every host->device copy of the masters has finished before the host optimizer
      // writes them.
      dev->record_on_side()->synchronize();
    }
    if (last_micro) {
      // One group call per communicator (NCCL: ncclGroupStart/End over all the shards).
      std::vector<comm::Comm*> comms;
      std::vector<std::vector<at::Tensor>> tensors;
      std::vector<std::vector<FlatParam*>> owners;
      for (auto& u : units) {
        comm::Comm* c = u->replicate;
        if (!c || c->size() == 1) continue;
        size_t k = std::find(comms.begin(), comms.end(), c) - comms.begin();
        if (k == comms.size()) {
          comms.push_back(c);
          tensors.emplace_back();
          owners.emplace_back();
        }
        for (auto& fp : u->flats) {
          owners[k].push_back(fp.get());
          tensors[k].push_back(on_comm_device(*fp, fp->grad_shard));
        }
      }
      std::vector<comm::WorkPtr> works;
      for (size_t k = 0; k < comms.size(); ++k) works.push_back(comms[k]->all_reduce_coalesced(tensors[k], comm::ReduceOp::Avg));
      for (auto& w : works) wait_timed(*w);
      for (size_t k = 0; k < comms.size(); ++k)
        for (size_t i = 0; i < owners[k].size(); ++i)
          if (!tensors[k][i].is_same(owners[k][i]->grad_shard)) owners[k][i]->grad_shard.copy_(tensors[k][i]);
    }
    for (auto& u : units) {
      if (u->reshard_after_backward && !u->is_ignored) reshard(*u);
      u->grads_prepared = false;
      u->finished = false;
      u->ready = 0;
    }
    in_backward = false;
  }
};

namespace {

class UnitHook : public ForwardHook {
 public:
  UnitHook(Engine::Impl* impl, Unit* unit) : impl_(impl), unit_(unit) {}
  at::Tensor run(const at::Tensor& input, const UnitBody& body) override {
    return impl_->run_forward(*unit_, input, body);
  }

 private:
  Engine::Impl* impl_;
  Unit* unit_;
};

class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(Engine::Impl* impl, Unit* unit) : impl_(impl), unit_(unit) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& inputs) override {
    impl_->on_param_ready(*unit_);
    return outputs;
  }

 private:
  Engine::Impl* impl_;
  Unit* unit_;
};

// Builds one FlatParam from its plan: sharded init, one flat at a time.
// `device`: where `full` (and, unless offloaded, master and grad_shard) live. Initial values are
// always computed on the CPU, so they do not depend on the device either.
std::unique_ptr<FlatParam> materialize(const FlatPlan& plan, const ModuleTree& tree, const comm::Comm* shard,
                                       const InitFn& init, const c10::Device& device, bool offload) {
  auto fp = std::make_unique<FlatParam>();
  fp->dtype = plan.dtype;
  fp->offloaded = offload;
  fp->shard_size = plan.shard_size;
  fp->shard_rank = plan.shard_size > 1 ? group_rank(shard) : 0;
  ST_CHECK(plan.shard_size == 1 || plan.shard_size == group_size(shard), "flat planned for ", plan.shard_size,
           " ranks, shard group has ", group_size(shard));
  for (const ParamPlan& p : plan.params) {
    ParamSlot s;
    s.name = p.name;
    s.shape = p.shape;
    s.numel = p.numel;
    s.offset = p.offset;
    s.owners = tree.params[p.index].owners;
    fp->slots.push_back(std::move(s));
  }
  fp->numel = plan.numel;
  fp->padded = plan.padded;
  fp->shard_numel = plan.shard_numel;

  // The whole flat parameter in fp32, filled parameter by parameter from the init rule,
  // so the values do not depend on the world size; only this rank's slice is kept.
  at::Tensor whole = at::zeros({fp->padded}, at::kFloat);
  {
    torch::autograd::AutoGradMode no_grad(false);
    for (auto& s : fp->slots) {
      at::Tensor view = whole.narrow(0, s.offset, s.numel).view(s.shape);
      init(s.name, view);
    }
  }
  // Offloaded state on a CUDA device goes to pinned host memory (asynchronous copies).
  const at::TensorOptions host_state =
      at::TensorOptions().dtype(at::kFloat).pinned_memory(offload && device.is_cuda());
  const at::TensorOptions state = offload ? host_state : at::TensorOptions().dtype(at::kFloat).device(device);
  if (fp->aliases_master()) {
    fp->master = whole.to(device);  // the same tensor on a CPU device
    fp->full = fp->master;
  } else {
    at::Tensor mine = whole.narrow(0, fp->shard_rank * fp->shard_numel, fp->shard_numel);
    if (offload) {
      fp->master = at::empty({fp->shard_numel}, host_state);
      fp->master.copy_(mine);
    } else {
      fp->master = device.is_cpu() ? mine.clone() : mine.to(device);
    }
    fp->full = at::empty({fp->padded}, at::TensorOptions().dtype(plan.dtype).device(device));
  }
  whole = at::Tensor();
  fp->grad_shard = at::zeros({fp->shard_numel}, state);
  for (auto& s : fp->slots) {
    s.param = storage_alias(fp->full, s.offset, s.shape);
    s.param.requires_grad_(true);
    for (auto& [module, local] : s.owners) ModuleAccess::params(*module)[local] = s.param;
  }
  if (!fp->aliases_master()) {
    resize_storage(fp->full, 0);
    fp->state = FlatParam::State::Sharded;
  } else {
    fp->state = FlatParam::State::Unsharded;
  }
  fp->stale = true;
  return fp;
}

}  // namespace

Engine::Engine(torch::nn::Module& root, EngineComms comms, EngineOptions opts, const InitFn& init)
    : impl_(std::make_unique<Impl>()), opts_(opts) {
  Impl& m = *impl_;
  m.comms = comms;
  m.opts = opts;
  ST_CHECK(opts.limit_all_gathers >= 1, "limit_all_gathers must be >= 1");
  m.dev = std::make_unique<DeviceRuntime>(opts.device);
  m.opts.device = opts_.device = m.dev->device();  // cuda -> cuda:0
  Impl::Scope scope(m);
  const c10::Device device = m.dev->device();
  ST_CHECK(dynamic_cast<Hookable*>(&root), "the root module must derive from fsdp::Hookable");

  // The layout (fsdp/wrap.cpp): units, flats, padding, aliasing, the ignored group.
  const ModuleTree tree = module_tree(root);
  m.layout = plan_units(tree, opts, group_size(comms.shard));
  for (const UnitPlan& up : m.layout) {
    auto u = std::make_unique<Unit>();
    u->name = up.name;
    u->is_root = up.is_root;
    u->is_ignored = up.is_ignored;
    if (up.is_ignored) {
      u->replicate = comms.world;  // kept whole on every rank, averaged like DDP
      u->reshard_after_backward = false;
    } else {
      u->module = tree.modules[up.module].second;
      u->hookable = dynamic_cast<Hookable*>(u->module);
      u->shard = comms.shard;
      u->shard_rs = comms.shard_rs;
      u->replicate = comms.replicate;
      u->reshard_after_forward = !u->is_root && reshards_after_forward(opts.strategy);
      u->reshard_after_backward = opts.strategy != Strategy::NoShard;
    }
    for (const FlatPlan& fplan : up.flats)
      u->flats.push_back(materialize(fplan, tree, u->shard, init, device, opts.cpu_offload));
    u->num_params = up.num_params();
    if (up.is_ignored) m.ignored = u.get();
    m.units.push_back(std::move(u));
  }

  for (auto& u : m.units) {
    for (auto& fp : u->flats) {
      for (auto& s : fp->slots) {
        auto acc = torch_compat::grad_accumulator(s.param);
        torch_compat::add_post_hook(*acc, std::make_unique<ReadyHook>(&m, u.get()));
        u->accumulators.push_back(std::move(acc));
      }
      m.stats.master_bytes += fp->master.numel() * 4;
      m.stats.grad_bytes += fp->grad_shard.numel() * 4;
    }
    if (u->hookable) u->hookable->set_forward_hook(std::make_shared<UnitHook>(&m, u.get()));
  }
}

Engine::~Engine() {
  Impl::Scope scope(*impl_);
  for (auto& u : impl_->units)
    if (u->hookable) u->hookable->set_forward_hook(nullptr);
  for (auto& p : impl_->pending)
    if (p.work) p.work->wait();
  for (auto& u : impl_->units)
    for (auto& fp : u->flats)
      if (fp->gather_work) fp->gather_work->wait();
  for (auto& d : impl_->d2h) d.done->synchronize();
  // Nothing queued on the device may still use storages freed below.
  synchronize_device(impl_->dev->device());
}

void Engine::set_last_micro_batch(bool last) { impl_->last_micro = last; }

void Engine::zero_grad() {
  for (auto& u : impl_->units)
    for (auto& fp : u->flats) fp->grad_shard.zero_();
}

double Engine::clip_grad_norm(double max_norm) {
  Impl::Scope scope(*impl_);
  // Sharded gradients: every element lives on exactly one rank of the shard group, so
  // sum squares over the shard group only (replicas hold copies: summing over them
  // too would count each element R times). Ignored parameters are whole everywhere.
  double sharded = 0, whole = 0;
  for (auto& u : impl_->units)
    for (auto& fp : u->flats) {
      // In fp64, a chunk at a time: a whole-shard fp64 square would be 4x the shard's bytes
      // (the peak of a no_shard step on the host).
      const at::Tensor& g = fp->grad_shard;
      at::Tensor acc = at::zeros({}, g.options().dtype(at::kDouble));
      for (int64_t b = 0; b < g.numel(); b += kNormChunkElems)
        acc.add_(g.narrow(0, b, std::min(kNormChunkElems, g.numel() - b)).to(at::kDouble).pow_(2).sum());
      const double s = acc.item<double>();
      (u->is_ignored ? whole : sharded) += s;
    }
  if (impl_->comms.shard && impl_->comms.shard->size() > 1) {
    // On the engine's device: that is where the shard group's backend reduces (NCCL on CUDA).
    at::Tensor t = at::full({1}, sharded, at::TensorOptions().dtype(at::kDouble).device(impl_->dev->device()));
    impl_->wait_timed(*impl_->comms.shard->all_reduce(t, comm::ReduceOp::Sum));
    sharded = t.item<double>();
  }
  double norm = std::sqrt(sharded + whole);
  if (max_norm > 0) {
    double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0)
      for (auto& u : impl_->units)
        for (auto& fp : u->flats) fp->grad_shard.mul_(coef);
  }
  return norm;
}

void Engine::mark_params_updated() {
  for (auto& u : impl_->units)
    for (auto& fp : u->flats) fp->stale = true;
}

std::vector<FlatParam*> Engine::flat_params() {
  std::vector<FlatParam*> out;
  for (auto& u : impl_->units)
    for (auto& fp : u->flats) out.push_back(fp.get());
  return out;
}

int Engine::num_units() const { return static_cast<int>(impl_->units.size()); }

const std::vector<UnitPlan>& Engine::layout() const { return impl_->layout; }

std::vector<std::string> Engine::unit_names() const {
  std::vector<std::string> out;
  for (auto& u : impl_->units) out.push_back(u->name);
  return out;
}

int64_t Engine::unit_live_bytes(int i) const {
  int64_t b = 0;
  for (auto& fp : impl_->units.at(i)->flats)
    if (!fp->aliases_master()) b += fp->live_full_bytes();
  return b;
}

MemoryStats Engine::memory() const {
  MemoryStats m = impl_->stats;
  const DeviceMemory d = device_memory(impl_->dev->device());
  m.device_allocated_bytes = d.allocated;
  m.device_peak_allocated_bytes = d.peak_allocated;
  return m;
}

void Engine::reset_peaks() {
  impl_->stats.peak_unsharded_bytes = impl_->stats.live_unsharded_bytes;
  impl_->stats.peak_grad_buffer_bytes = impl_->stats.live_grad_buffer_bytes;
  impl_->stats.max_all_gathers_in_flight = 0;
  reset_device_peak(impl_->dev->device());
}

const c10::Device& Engine::device() const { return impl_->dev->device(); }

}  // namespace shardtrain::fsdp
