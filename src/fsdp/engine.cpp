// Engine: wrapping (units, flat params, sharded init) and the unshard/reshard/reduce
// machinery driven by forward hooks, tensor hooks and AccumulateGrad post hooks.
#include "shardtrain/fsdp/engine.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <unordered_map>

#include "recompute.h"
#include "shardtrain/fsdp/forward_hook.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/timer.h"

namespace shardtrain::fsdp {
namespace {

// Module::parameters_ is protected; the engine must swap meta parameters for real ones
// in place (same dict entry) so the model keeps working unchanged.
struct ModuleAccess : torch::nn::Module {
  static torch::OrderedDict<std::string, at::Tensor>& params(torch::nn::Module& m) {
    return m.*(&ModuleAccess::parameters_);
  }
};

bool matches_any(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns)
    if (!p.empty() && name.find(p) != std::string::npos) return true;
  return false;
}

int group_size(const comm::Comm* c) { return c ? c->size() : 1; }
int group_rank(const comm::Comm* c) { return c ? c->rank() : 0; }

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

struct Engine::Impl {
  EngineComms comms;
  EngineOptions opts;
  std::vector<std::unique_ptr<Unit>> units;  // root first, ignored group last (if any)
  Unit* ignored = nullptr;
  std::vector<Unit*> exec_order;             // forward order, recorded in the first forward
  bool order_recorded = false;
  std::deque<FlatParam*> inflight;           // issued all-gathers not yet waited
  bool in_backward = false, last_micro = true;
  std::vector<PendingReduce> pending;
  MemoryStats stats;

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
    resize_storage(fp.full, fp.full_bytes());
    track_live();
    at::Tensor mine = storage_alias(fp.full, fp.shard_rank * fp.shard_numel, {fp.shard_numel});
    mine.copy_(fp.master);
    fp.stale = false;
    if (fp.shard_size == 1) {
      fp.state = FlatParam::State::Unsharded;
      return;
    }
    fp.gather_work = u.shard->all_gather(storage_alias(fp.full, 0, {fp.padded}), mine);
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
    if (!order_recorded && u.order_index < 0) {
      u.order_index = static_cast<int>(exec_order.size());
      exec_order.push_back(&u);
    }
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
      out.register_hook([this, up](const at::Tensor&) { pre_backward(*up); });
    }
    return out;
  }

  // ---- backward --------------------------------------------------------------------
  void begin_backward() {
    in_backward = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { end_backward(); });
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
      fp.grad_shard.add_(in);
      stats.live_grad_buffer_bytes -= fp.full_bytes();
      return;
    }
    at::Tensor out = at::empty({fp.shard_numel}, in.options());
    comm::Comm* c = u.shard_rs ? u.shard_rs : u.shard;
    pending.push_back({&fp, c->reduce_scatter(out, in, comm::ReduceOp::Avg), out, in});
    // Unsharded gradient buffers live until their reduce-scatter is done: retire the
    // finished ones now, and wait for the oldest beyond a few, so backward holds a
    // bounded number of them instead of the whole model's.
    retire_reductions(kMaxPendingReductions);
  }

  static constexpr size_t kMaxPendingReductions = 2;

  void retire(PendingReduce& p) {
    wait_timed(*p.work);
    p.fp->grad_shard.add_(p.out);
    stats.live_grad_buffer_bytes -= p.fp->full_bytes();
    p = PendingReduce{};
  }

  // Retires completed reductions in issue order, and more until at most `keep` remain.
  void retire_reductions(size_t keep) {
    size_t done = 0;
    while (done < pending.size() && (pending.size() - done > keep || pending[done].work->is_completed()))
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

  void end_backward() {
    // Units whose parameters did not all receive gradients (unused this step).
    for (auto& u : units) finish_unit(*u);
    retire_reductions(0);
    if (last_micro) {
      std::vector<comm::WorkPtr> works;
      for (auto& u : units) {
        comm::Comm* c = u->replicate;
        if (!c || c->size() == 1) continue;
        for (auto& fp : u->flats) works.push_back(c->all_reduce(fp->grad_shard, comm::ReduceOp::Avg));
      }
      for (auto& w : works) wait_timed(*w);
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

struct ParamInfo {
  std::string name;
  at::Tensor meta;
  std::vector<std::pair<torch::nn::Module*, std::string>> owners;
};

// Builds one FlatParam from its parameters: sharded init, one unit at a time.
std::unique_ptr<FlatParam> materialize(const std::vector<ParamInfo*>& params, at::ScalarType dtype,
                                       const comm::Comm* shard, const InitFn& init) {
  auto fp = std::make_unique<FlatParam>();
  fp->dtype = dtype;
  fp->shard_size = group_size(shard);
  fp->shard_rank = group_rank(shard);
  int64_t offset = 0;
  for (ParamInfo* p : params) {
    ParamSlot s;
    s.name = p->name;
    s.shape = p->meta.sizes().vec();
    s.numel = p->meta.numel();
    s.offset = offset;
    s.owners = p->owners;
    offset += s.numel;
    fp->slots.push_back(std::move(s));
  }
  fp->numel = offset;
  const int64_t S = fp->shard_size;
  fp->padded = std::max<int64_t>(S, (offset + S - 1) / S * S);
  fp->shard_numel = fp->padded / S;

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
  if (fp->aliases_master()) {
    fp->master = whole;
    fp->full = whole;
  } else {
    fp->master = whole.narrow(0, fp->shard_rank * fp->shard_numel, fp->shard_numel).clone();
    fp->full = at::empty({fp->padded}, at::TensorOptions().dtype(dtype));
  }
  whole = at::Tensor();
  fp->grad_shard = at::zeros({fp->shard_numel}, at::kFloat);
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
  ST_CHECK(dynamic_cast<Hookable*>(&root), "the root module must derive from fsdp::Hookable");

  // Modules in pre-order with their qualified prefixes. named_modules() of a module
  // returns shared_ptrs; the root itself is handled by address.
  std::vector<std::pair<std::string, torch::nn::Module*>> modules;
  modules.emplace_back("", &root);
  for (auto& item : root.named_modules("", /*include_self=*/false)) modules.emplace_back(item.key(), item.value().get());

  // Every distinct parameter (by TensorImpl), with all the (module, local name) places
  // that hold it, named by its first qualified name.
  std::vector<ParamInfo> params;
  std::unordered_map<const void*, size_t> index;
  std::map<std::string, size_t> by_name;
  for (auto& [prefix, mod] : modules) {
    for (auto& item : mod->named_parameters(/*recurse=*/false)) {
      const void* key = item.value().unsafeGetTensorImpl();
      std::string qual = prefix.empty() ? item.key() : prefix + "." + item.key();
      auto it = index.find(key);
      if (it == index.end()) {
        index[key] = params.size();
        by_name[qual] = params.size();
        params.push_back({qual, item.value(), {}});
        it = index.find(key);
      }
      params[it->second].owners.emplace_back(mod, item.key());
    }
  }

  // Units: hookable modules picked by type or by size; each parameter belongs to the
  // innermost unit that contains it, else to the root; ignored ones to the ignored group.
  std::vector<std::string> unit_prefix;  // "" = root
  std::vector<torch::nn::Module*> unit_module;
  unit_prefix.push_back("");
  unit_module.push_back(&root);
  auto under = [](const std::string& name, const std::string& prefix) {
    return prefix.empty() || name.compare(0, prefix.size() + 1, prefix + ".") == 0;
  };
  std::vector<bool> is_unit(modules.size(), false);
  if (!opts.wrap_types.empty() || opts.min_num_params > 0) {
    // Bottom-up (reverse pre-order visits children before parents).
    std::vector<bool> claimed(params.size(), false);
    for (size_t mi = modules.size(); mi-- > 1;) {
      auto* mod = modules[mi].second;
      if (!dynamic_cast<Hookable*>(mod)) continue;
      const std::string& prefix = modules[mi].first;
      bool by_type = std::find(opts.wrap_types.begin(), opts.wrap_types.end(), mod->name()) != opts.wrap_types.end();
      int64_t unclaimed = 0;
      for (size_t pi = 0; pi < params.size(); ++pi)
        if (!claimed[pi] && under(params[pi].name, prefix) && !matches_any(params[pi].name, opts.ignored))
          unclaimed += params[pi].meta.numel();
      bool by_size = opts.min_num_params > 0 && unclaimed >= opts.min_num_params;
      if (!(by_type || by_size) || unclaimed == 0) continue;
      is_unit[mi] = true;
      for (size_t pi = 0; pi < params.size(); ++pi)
        if (under(params[pi].name, prefix)) claimed[pi] = true;
    }
    for (size_t mi = 1; mi < modules.size(); ++mi)
      if (is_unit[mi]) {
        unit_prefix.push_back(modules[mi].first);
        unit_module.push_back(modules[mi].second);
      }
  }

  std::vector<std::vector<ParamInfo*>> members(unit_prefix.size());
  std::vector<ParamInfo*> ignored_members;
  for (auto& p : params) {
    if (matches_any(p.name, opts.ignored)) {
      ignored_members.push_back(&p);
      continue;
    }
    size_t best = 0;
    for (size_t ui = 1; ui < unit_prefix.size(); ++ui)
      if (under(p.name, unit_prefix[ui]) && unit_prefix[ui].size() > unit_prefix[best].size()) best = ui;
    members[best].push_back(&p);
  }

  for (size_t ui = 0; ui < unit_prefix.size(); ++ui) {
    auto u = std::make_unique<Unit>();
    u->name = ui == 0 ? "<root>" : unit_prefix[ui];
    u->module = unit_module[ui];
    u->hookable = dynamic_cast<Hookable*>(u->module);
    u->is_root = ui == 0;
    u->shard = comms.shard;
    u->shard_rs = comms.shard_rs;
    u->replicate = comms.replicate;
    u->reshard_after_forward = !u->is_root && reshards_after_forward(opts.strategy);
    u->reshard_after_backward = opts.strategy != Strategy::NoShard;
    // Split by dtype: keep_fp32 parameters stay fp32 under mixed precision.
    std::vector<ParamInfo*> compute, fp32;
    for (ParamInfo* p : members[ui]) {
      bool keep = opts.mp.param_dtype != at::kFloat && matches_any(p->name, opts.mp.keep_fp32);
      (keep ? fp32 : compute).push_back(p);
    }
    if (!compute.empty()) u->flats.push_back(materialize(compute, opts.mp.param_dtype, comms.shard, init));
    if (!fp32.empty()) u->flats.push_back(materialize(fp32, at::kFloat, comms.shard, init));
    u->num_params = static_cast<int>(members[ui].size());
    m.units.push_back(std::move(u));
  }
  if (!ignored_members.empty()) {
    auto u = std::make_unique<Unit>();
    u->name = "<ignored>";
    u->is_ignored = true;
    u->replicate = comms.world;  // kept whole on every rank, averaged like DDP
    u->reshard_after_backward = false;
    u->flats.push_back(materialize(ignored_members, at::kFloat, nullptr, init));
    u->num_params = static_cast<int>(ignored_members.size());
    m.ignored = u.get();
    m.units.push_back(std::move(u));
  }

  for (auto& u : m.units) {
    for (auto& fp : u->flats) {
      for (auto& s : fp->slots) {
        auto acc = torch::autograd::impl::grad_accumulator(s.param);
        acc->add_post_hook(std::make_unique<ReadyHook>(&m, u.get()));
        u->accumulators.push_back(std::move(acc));
      }
      m.stats.master_bytes += fp->master.numel() * 4;
      m.stats.grad_bytes += fp->grad_shard.numel() * 4;
    }
    if (u->hookable) u->hookable->set_forward_hook(std::make_shared<UnitHook>(&m, u.get()));
  }
}

Engine::~Engine() {
  for (auto& u : impl_->units)
    if (u->hookable) u->hookable->set_forward_hook(nullptr);
  for (auto& p : impl_->pending)
    if (p.work) p.work->wait();
  for (auto& u : impl_->units)
    for (auto& fp : u->flats)
      if (fp->gather_work) fp->gather_work->wait();
}

void Engine::set_last_micro_batch(bool last) { impl_->last_micro = last; }

void Engine::zero_grad() {
  for (auto& u : impl_->units)
    for (auto& fp : u->flats) fp->grad_shard.zero_();
}

double Engine::clip_grad_norm(double max_norm) {
  // Sharded gradients: every element lives on exactly one rank of the shard group, so
  // sum squares over the shard group only (replicas hold copies: summing over them
  // too would count each element R times). Ignored parameters are whole everywhere.
  double sharded = 0, whole = 0;
  for (auto& u : impl_->units)
    for (auto& fp : u->flats) {
      double s = fp->grad_shard.to(at::kDouble).pow(2).sum().item<double>();
      (u->is_ignored ? whole : sharded) += s;
    }
  if (impl_->comms.shard && impl_->comms.shard->size() > 1) {
    at::Tensor t = at::full({1}, sharded, at::kDouble);
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

MemoryStats Engine::memory() const { return impl_->stats; }

void Engine::reset_peaks() {
  impl_->stats.peak_unsharded_bytes = impl_->stats.live_unsharded_bytes;
  impl_->stats.peak_grad_buffer_bytes = impl_->stats.live_grad_buffer_bytes;
  impl_->stats.max_all_gathers_in_flight = 0;
}

}  // namespace shardtrain::fsdp
