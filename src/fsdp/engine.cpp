// Engine: the facade. Builds the units from the layout (fsdp::plan_units), installs the hooks
// that drive their transitions (schedule.cpp), and answers the trainer's calls between steps
// (zero_grad, clip_grad_norm, memory statistics).
#include "shardtrain/fsdp/engine.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>

#include "collectives.h"
#include "engine_impl.h"
#include "shardtrain/fsdp/exact_square_sum.h"
#include "outer_sync.h"
#include "shardtrain/util/log.h"
#include "zeropp.h"
#include "shardtrain/fsdp/forward_hook.h"
#include "shardtrain/fsdp/wrap.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/torch_compat.h"

namespace shardtrain::fsdp {
namespace {

int group_size(const comm::Comm* c) { return c ? c->size() : 1; }
int group_rank(const comm::Comm* c) { return c ? c->rank() : 0; }

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

// Every communicator the engine uses, wrapped in a byte counter (one per distinct Comm).
EngineComms count_bytes(Engine::Impl& m, const EngineComms& in) {
  auto wrap = [&](comm::Comm* c) -> comm::Comm* {
    if (!c) return nullptr;
    m.counted.push_back(std::make_unique<CountingComm>(*c, m.opts.host_id, m.dev->device(), m.bytes));
    return m.counted.back().get();
  };
  EngineComms out;
  out.shard = wrap(in.shard);
  out.shard_rs = in.shard_rs == in.shard ? out.shard : wrap(in.shard_rs);
  out.replicate = wrap(in.replicate);
  out.world = in.world == in.shard ? out.shard : wrap(in.world);
  out.node = wrap(in.node);
  return out;
}

}  // namespace

Engine::Impl::~Impl() = default;

Engine::Engine(torch::nn::Module& root, EngineComms comms, EngineOptions opts, const InitFn& init)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  ST_CHECK(opts.limit_all_gathers >= 1, "limit_all_gathers must be >= 1");
  m.dev = std::make_unique<DeviceRuntime>(opts.device);
  opts.device = m.dev->device();  // cuda -> cuda:0
  m.opts = opts;
  Impl::Scope scope(m);
  const c10::Device device = m.dev->device();
  m.comms = count_bytes(m, comms);
  comms = m.comms;
  // The strategy x option rules (options.h), the same the deck's reader applies.
  if (const auto bad = check_strategy_options(opts)) throw UserError(bad->message());
  if (opts.compression.any()) {
    ST_CHECK(!opts.compression.secondary_shards || comms.node,
             "secondary shards need the node group (GroupOptions::secondary_shards)");
    m.zpp = std::make_unique<ZeroPP>(opts.compression, device, comms.node);
  }
  ST_CHECK(dynamic_cast<Hookable*>(&root), "the root module must derive from fsdp::Hookable");

  // The layout (fsdp/wrap.cpp): units, flats, padding, aliasing, the ignored group.
  const ModuleTree tree = module_tree(root);
  m.layout = plan_units(tree, opts, group_size(comms.shard));
  for (const UnitPlan& up : m.layout) {
    auto u = std::make_unique<Unit>();
    u->name = up.name;
    u->kind = up.kind;
    if (u->kind == UnitKind::Ignored) {
      u->replicate = comms.world;  // kept whole on every rank, averaged like DDP
      u->reshard_after_backward = false;
      if (opts.reproducible) {
        // The same tree as every other flat: leaves summed over the shard group first (an
        // all-reduce, the flat being whole), then over this rank's leaves, then replicas.
        u->shard_rs = comms.shard_rs ? comms.shard_rs : comms.shard;
        u->replicate = comms.replicate;
      }
    } else {
      u->module = tree.modules[up.module].second;
      u->hookable = dynamic_cast<Hookable*>(u->module);
      u->shard = comms.shard;
      u->shard_rs = comms.shard_rs;
      u->replicate = comms.replicate;
      u->reshard_after_forward = u->kind != UnitKind::Root && reshards_after_forward(opts.strategy);
      u->reshard_after_backward = opts.strategy != Strategy::NoShard;
    }
    for (const FlatPlan& fplan : up.flats) {
      ST_CHECK(fplan.shard_size == 1 || fplan.shard_size == group_size(u->shard), "flat planned for ",
               fplan.shard_size, " ranks, shard group has ", group_size(u->shard));
      u->flats.push_back(std::make_unique<FlatParam>(fplan, tree, group_rank(u->shard), init, device, opts.cpu_offload));
    }
    u->num_params = up.num_trainable_params();
    u->has_frozen = up.has_frozen();
    if (opts.replica_sync.diloco()) {
      // DiLoCo: each replica trains alone between outer steps. A sharded flat's gradient stops at
      // its shard group's reduce-scatter; the ignored group (whole on every rank) is averaged
      // over the shard group instead of the world (reproducible: already summed over it).
      u->replicate = u->kind == UnitKind::Ignored && !opts.reproducible ? comms.shard : nullptr;
    }
    if (u->kind == UnitKind::Ignored) m.ignored = u.get();
    m.units.push_back(std::move(u));
  }
  if (opts.replica_sync.diloco()) {
    check_fragments(opts.replica_sync.fragments, static_cast<int>(m.units.size()));
    std::vector<std::vector<FlatParam*>> flats;
    for (auto& u : m.units) {
      flats.emplace_back();
      for (auto& fp : u->flats) flats.back().push_back(fp.get());
    }
    m.outer = std::make_unique<OuterSync>(opts.replica_sync, opts.compression, flats, comms.replicate, comms.shard,
                                          device, opts.reproducible);
    if ((!comms.replicate || comms.replicate->size() == 1) && group_rank(comms.world) == 0)
      log::warn("parallel.replica_sync = \"diloco\" with one replica: nothing is averaged; the outer step applies "
                "this replica's own change (a lookahead optimizer), not DiLoCo");
  }

  for (auto& u : m.units) {
    for (auto& fp : u->flats) {
      if (fp->frozen()) {  // no gradient: nothing to wait for, nothing to count but its shard
        m.stats.frozen_bytes += fp->shard_bytes();
        continue;
      }
      for (auto& s : fp->slots()) {
        auto acc = torch_compat::grad_accumulator(s.param);
        torch_compat::add_post_hook(*acc, std::make_unique<ReadyHook>(&m, u.get()));
        u->accumulators.push_back(std::move(acc));
      }
      m.stats.master_bytes += fp->master().numel() * 4;
      m.stats.grad_bytes += fp->grad_shard().numel() * 4;
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
      if (fp->gather_work()) fp->gather_work()->wait();
  for (auto& d : impl_->d2h) d.done->synchronize();
  if (impl_->outer) impl_->outer->wait_all();  // overlapped outer averages still in flight
  // Nothing queued on the device may still use storages freed below.
  synchronize_device(impl_->dev->device());
}

void Engine::set_last_micro_batch(bool last) { impl_->last_micro = last; }

void Engine::zero_grad() {
  impl_->leaf_sums.clear();
  for (auto& u : impl_->units)
    for (auto& fp : u->flats)
      if (!fp->frozen()) fp->grad_shard().zero_();
}

double Engine::clip_grad_norm(double max_norm) {
  Impl::Scope scope(*impl_);
  const double norm = impl_->opts.reproducible ? exact_grad_norm() : fast_grad_norm();
  if (max_norm > 0) {
    double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0)
      for (auto& u : impl_->units)
        for (auto& fp : u->flats)
          if (!fp->frozen()) fp->grad_shard().mul_(coef);
  }
  return norm;
}

// train.reproducible: the sum of squares exactly (integers), so neither the split of the
// flats into shards nor the order of the sums changes a bit of it.
double Engine::exact_grad_norm() {
  ExactSquareSum sharded, whole;
  for (auto& u : impl_->units)
    for (auto& fp : u->flats) {
      if (fp->frozen()) continue;
      const at::Tensor g = fp->grad_shard().to(at::kCPU).contiguous();
      (u->kind == UnitKind::Ignored ? whole : sharded).add(g.data_ptr<float>(), g.numel());
    }
  if (impl_->comms.shard && impl_->comms.shard->size() > 1) {
    std::vector<int64_t> w = sharded.words();
    at::Tensor t = at::from_blob(w.data(), {static_cast<int64_t>(w.size())}, at::kLong).clone();
    impl_->wait_timed(*sum_across(*impl_->comms.shard, t));
    sharded = ExactSquareSum::from_words(t.data_ptr<int64_t>(), t.numel());
  }
  sharded.merge(whole);
  return std::sqrt(sharded.value());
}

double Engine::fast_grad_norm() {
  // Sharded gradients: every element lives on exactly one rank of the shard group, so
  // sum squares over the shard group only (replicas hold copies: summing over them
  // too would count each element R times). Ignored parameters are whole everywhere.
  double sharded = 0, whole = 0;
  for (auto& u : impl_->units)
    for (auto& fp : u->flats) {
      if (fp->frozen()) continue;
      const double s = sum_of_squares(fp->grad_shard());
      (u->kind == UnitKind::Ignored ? whole : sharded) += s;
    }
  if (impl_->comms.shard && impl_->comms.shard->size() > 1) {
    // On the engine's device: that is where the shard group's backend reduces (NCCL on CUDA).
    at::Tensor t = at::full({1}, sharded, at::TensorOptions().dtype(at::kDouble).device(impl_->dev->device()));
    impl_->wait_timed(*sum_across(*impl_->comms.shard, t));
    sharded = t.item<double>();
  }
  return std::sqrt(sharded + whole);
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

void Engine::finish_nf4() {
  Impl::Scope scope(*impl_);
  for (auto& u : impl_->units)
    for (auto& fp : u->flats) {
      if (!fp->awaits_absmax()) continue;
      // Each tensor's mean absmax needs all of its blocks: the flat's absmax, gathered over the
      // shard group (1/64 of the bf16 bytes at most).
      const at::Tensor mine = fp->local_absmax();
      if (fp->shard_size() == 1) {
        fp->finish_absmax(mine);
        continue;
      }
      ReplicaGather g = gather_across_replicas(*u->shard, mine.to(device()));
      impl_->wait_timed(*g.work);
      fp->finish_absmax(g.all);
    }
}

void Engine::reset_peaks() {
  impl_->stats.peak_unsharded_bytes = impl_->stats.live_unsharded_bytes;
  impl_->stats.peak_grad_buffer_bytes = impl_->stats.live_grad_buffer_bytes;
  impl_->stats.max_all_gathers_in_flight = 0;
  impl_->stats.peak_secondary_bytes = impl_->stats.live_secondary_bytes;
  reset_device_peak(impl_->dev->device());
}

CommStats Engine::comm_stats() const {
  CommStats s = impl_->zpp ? impl_->zpp->stats() : CommStats{};
  s.intra_node_bytes = impl_->bytes.intra.load();
  s.inter_node_bytes = impl_->bytes.inter.load();
  if (impl_->outer) {
    s.outer_steps = impl_->outer->outer_steps();
    s.fragment_syncs = impl_->outer->fragment_syncs();
    s.outer_rel_error = impl_->outer->guard_rel_error();
    s.outer_fallbacks = impl_->outer->fallbacks();
  }
  return s;
}

namespace {
// The replicas across which a flat's gradient is averaged with error feedback (1: none).
int residual_replicas(const Engine::Impl& m) {
  if (!m.zpp || !m.zpp->options().quantize_grads || !m.comms.replicate) return 1;
  return m.comms.replicate->size();
}
}  // namespace

std::vector<std::string> Engine::residual_names() const {
  std::vector<std::string> out;
  const int R = residual_replicas(*impl_);
  if (R > 1)
    for (int k = 0; k < R; ++k) out.push_back("qgz_residual.r" + std::to_string(k));
  return out;
}

std::vector<std::vector<at::Tensor>>& Engine::residual_staging(bool gather) {
  Impl::Scope scope(*impl_);
  auto& out = impl_->residual_host;
  const int R = residual_replicas(*impl_);
  if (R == 1) {
    out.clear();
    return out;
  }
  size_t i = 0;
  out.resize(flat_params().size());
  for (auto& u : impl_->units)
    for (auto& fp : u->flats) {
      const int64_t L = fp->shard_numel();
      std::vector<at::Tensor>& per = out[i++];
      per.resize(R);
      for (auto& t : per)
        if (!t.defined() || t.numel() != L) t = at::zeros({L}, at::kFloat);
      if (!gather) continue;
      if (u->kind == UnitKind::Ignored || fp->frozen()) {  // not quantized / no gradient: nothing left over
        for (auto& t : per) t.zero_();
        continue;
      }
      ReplicaGather g = gather_across_replicas(*u->replicate, impl_->zpp->residual(*fp));
      impl_->wait_timed(*g.work);
      for (int r = 0; r < R; ++r) per[r].copy_(g.all.narrow(0, r * L, L));
    }
  return out;
}

void Engine::load_residuals() {
  Impl::Scope scope(*impl_);
  if (impl_->zpp) impl_->zpp->masters_changed();
  const int R = residual_replicas(*impl_);
  if (R == 1) return;
  auto& staged = impl_->residual_host;
  size_t i = 0;
  for (auto& u : impl_->units)
    for (auto& fp : u->flats) {
      ST_CHECK(i < staged.size() && static_cast<int>(staged[i].size()) == R, "load_residuals: nothing staged");
      if (u->kind != UnitKind::Ignored && !fp->frozen()) impl_->zpp->residual(*fp).copy_(staged[i][u->replicate->rank()]);
      ++i;
    }
}

std::vector<int> Engine::sync_replicas(int64_t step) {
  Impl& m = *impl_;
  if (!m.outer) return {};
  Impl::Scope scope(m);
  m.last_synced = m.outer->step(step, [&m](comm::Work& w) { m.wait_timed(w); });
  // The masters changed outside the inner step: quantized copies are made again.
  if (!m.last_synced.empty() && m.zpp) m.zpp->masters_changed();
  return m.last_synced;
}

namespace {
int replicas_of(const Engine::Impl& m) { return m.comms.replicate ? m.comms.replicate->size() : 1; }
}  // namespace

std::vector<std::string> Engine::diloco_state_names(const std::vector<std::string>& opt_states) const {
  std::vector<std::string> out;
  if (!impl_->outer) return out;
  const int R = replicas_of(*impl_);
  out.push_back("diloco.outer_momentum");
  for (int k = 0; k < R; ++k) out.push_back("diloco.local.r" + std::to_string(k));
  for (const std::string& s : opt_states)
    for (int k = 0; k < R; ++k) out.push_back(s + ".r" + std::to_string(k));
  if (impl_->opts.replica_sync.overlap_steps > 0) {
    // Overlapped averages in flight at the save: the average (the same on every replica) and
    // each replica's master at the issue (zeros for flats whose fragment has none).
    out.push_back("diloco.pending_avg");
    for (int k = 0; k < R; ++k) out.push_back("diloco.issue.r" + std::to_string(k));
  }
  return out;
}

std::vector<std::vector<at::Tensor>>& Engine::diloco_staging(const OptStateFn& opt_state, size_t opt_states,
                                                              bool gather) {
  Impl& m = *impl_;
  Impl::Scope scope(m);
  auto& out = m.diloco_host;
  if (!m.outer) {
    out.clear();
    return out;
  }
  const int R = replicas_of(m);
  const bool overlap = m.opts.replica_sync.overlap_steps > 0;
  const size_t base = 2 + static_cast<size_t>(R) * (1 + opt_states);  // the pending states' first index
  const size_t per = base + (overlap ? 1 + R : 0);
  const std::vector<FlatParam*> flats = flat_params();
  if (gather && overlap) m.outer->finish_in_flight([&m](comm::Work& w) { m.wait_timed(w); });
  out.resize(flats.size());
  for (size_t i = 0; i < flats.size(); ++i) {
    const int64_t L = flats[i]->shard_numel();
    std::vector<at::Tensor>& d = out[i];
    d.resize(per);
    for (auto& t : d)
      if (!t.defined() || t.numel() != L) t = at::zeros({L}, at::kFloat);
    if (!gather || flats[i]->frozen()) continue;  // a frozen flat has no DiLoCo state (checkpoints skip it)
    d[0].copy_(m.outer->outer(i));
    d[1].copy_(m.outer->momentum(i));
    // Every replica's copy of a shard-sized vector into d[first + k].
    auto all = [&](const at::Tensor& mine, size_t first) {
      if (R == 1) {
        d[first].copy_(mine);
        return;
      }
      ReplicaGather g = gather_across_replicas(*m.comms.replicate, mine.to(m.dev->device()));
      m.wait_timed(*g.work);
      for (int k = 0; k < R; ++k) d[first + k].copy_(g.all.narrow(0, k * L, L));
    };
    all(flats[i]->master(), 2);
    for (size_t s = 0; s < opt_states; ++s) all(opt_state(i, s), 2 + R * (1 + s));
    if (!overlap) continue;
    d[base].copy_(m.outer->pending_average(i));
    all(m.outer->issued_master(i), base + 1);
  }
  return out;
}

void Engine::load_diloco(const OptStateFn& opt_state, size_t opt_states, const std::vector<bool>& present) {
  Impl& m = *impl_;
  if (!m.outer) return;
  Impl::Scope scope(m);
  const int R = replicas_of(m);
  const int me = m.comms.replicate ? m.comms.replicate->rank() : 0;
  const bool overlap = m.opts.replica_sync.overlap_steps > 0;
  const size_t base = 2 + static_cast<size_t>(R) * (1 + opt_states);
  ST_CHECK(present.size() == base - 1 + (overlap ? 1 + R : 0), "load_diloco: ", present.size(), " flags");
  // present[0]: the momentum; [1, base - 1): the replicas' masters and optimizer states; then the
  // overlapped averages in flight (tau > 0).
  bool locals = true, pending = true;
  for (size_t j = 1; j < base - 1; ++j) locals = locals && present[j];
  for (size_t j = base - 1; j < present.size(); ++j) pending = pending && present[j];
  if (present[0] && !locals && group_rank(m.comms.world) == 0)
    log::info("# diloco: the checkpoint's replicas' own states do not fit " + std::to_string(R) +
              " replicas: every replica restarts from its outer copy (the inner steps since the last outer step are "
              "not carried over)");
  const std::vector<FlatParam*> flats = flat_params();
  auto& d = m.diloco_host;
  for (size_t i = 0; i < flats.size(); ++i) {
    if (flats[i]->frozen()) continue;
    m.outer->outer(i).copy_(flats[i]->master());
    if (present[0]) m.outer->momentum(i).copy_(d.at(i).at(1));
    else m.outer->momentum(i).zero_();
    if (!locals) continue;
    flats[i]->write_master().copy_(d.at(i).at(2 + me));
    for (size_t s = 0; s < opt_states; ++s) opt_state(i, s).copy_(d.at(i).at(2 + R * (1 + s) + me));
  }
  if (overlap) {
    // The averages in flight at the save continue only with the replicas' own states.
    std::vector<at::Tensor> avg, issued;
    for (size_t i = 0; i < flats.size(); ++i) {
      avg.push_back(d.at(i).at(base));
      issued.push_back(d.at(i).at(base + 1 + me));
    }
    m.outer->restore(locals && pending, avg, issued);
  }
  if (m.zpp) m.zpp->masters_changed();
}

GuardState Engine::guard_state() {
  GuardState g;
  if (impl_->zpp) {
    impl_->zpp->fallbacks(flat_params(), g.weights, g.grads);
    g.steps = impl_->zpp->steps();
  }
  if (impl_->outer) g.outer = impl_->outer->fallback_flags();
  return g;
}

std::string Engine::restore_guard_state(const GuardState& g) {
  std::string skipped;
  const GuardState now = guard_state();
  auto any = [](const std::vector<uint8_t>& v) { return std::count_if(v.begin(), v.end(), [](uint8_t x) { return x; }); };
  if (impl_->zpp) {
    if (g.weights.size() == now.weights.size() && g.grads.size() == now.grads.size())
      impl_->zpp->restore(flat_params(), g.weights, g.grads, g.steps);
    else if (any(g.weights) + any(g.grads) > 0)
      skipped += log::fmt("the checkpoint's ZeRO++ fallbacks are for ", g.weights.size(), " flats, this run has ",
                          now.weights.size(), ": every flat starts quantized again");
  }
  if (impl_->outer) {
    if (g.outer.size() == now.outer.size()) {
      impl_->outer->restore_fallbacks(g.outer);
    } else if (any(g.outer) > 0) {
      if (!skipped.empty()) skipped += "; ";
      skipped += log::fmt("the checkpoint's DiLoCo fallbacks are for ", g.outer.size(), " fragments, this run has ",
                          now.outer.size(), ": every fragment starts in diloco.outer_dtype again");
    }
  }
  return skipped;
}

const c10::Device& Engine::device() const { return impl_->dev->device(); }

const EngineOptions& Engine::options() const { return impl_->opts; }

}  // namespace shardtrain::fsdp
