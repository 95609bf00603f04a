// OuterSync: DiLoCo's outer state and outer step (outer_sync.h).
#include "outer_sync.h"

#include "collectives.h"
#include <algorithm>

#include "shardtrain/fsdp/quantize.h"
#include "shardtrain/optim/outer_sgd.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/log.h"

namespace shardtrain::fsdp {

OuterSync::OuterSync(const ReplicaSync& rs, const Compression& c,
                     const std::vector<std::vector<FlatParam*>>& flats_by_unit, comm::Comm* replicate,
                     comm::Comm* shard, const c10::Device& comm_device, bool tree)
    : rs_(rs), c_(c), fallback_(static_cast<size_t>(std::max(rs.fragments, 1)), false), replicate_(replicate),
      shard_(shard), comm_device_(comm_device), tree_(tree) {
  ST_CHECK(c.block >= 1, "diloco: the quantization block must be >= 1, got ", c.block);
  ST_CHECK(rs.inner_steps >= 1 && rs.fragments >= 1, "diloco: inner_steps and fragments must be >= 1");
  const int units = static_cast<int>(flats_by_unit.size());
  for (int u = 0; u < units; ++u)
    for (FlatParam* fp : flats_by_unit[u]) {
      PerFlat p;
      p.fp = fp;
      if (fp->frozen()) {
        // Nothing trains, nothing is averaged: in no fragment, with empty outer state.
        p.fragment = -1;
        p.outer = at::empty({0}, fp->master().options().dtype(at::kFloat));
        p.momentum = p.outer;
        flats_.push_back(std::move(p));
        continue;
      }
      p.fragment = fragment_of_unit(u, units, rs.fragments);
      // Every replica starts from the same masters (the init is the same at any world size).
      p.outer = fp->master().clone();
      p.momentum = at::zeros_like(fp->master());
      flats_.push_back(std::move(p));
    }
}

int64_t OuterSync::offset(int f) const { return static_cast<int64_t>(f) * rs_.inner_steps / rs_.fragments; }

bool OuterSync::due(int f, int64_t step) const { return step >= 1 && (step - offset(f)) % rs_.inner_steps == 0; }

std::vector<int> OuterSync::step(int64_t step, const std::function<void(comm::Work&)>& wait) {
  const int64_t tau = rs_.overlap_steps;
  if (!restored_avg_.empty()) {
    // After a load at step - 1: the fragments whose last issue is still due from now on.
    for (int f = 0; f < rs_.fragments; ++f) {
      for (int64_t t = step - 1; t >= 1 && t + tau >= step; --t) {
        if (!due(f, t)) continue;
        Pending p;
        p.fragment = f;
        p.due = t + tau;
        for (size_t i = 0; i < flats_.size(); ++i)
          if (flats_[i].fragment == f) {
            p.flats.push_back(i);
            p.result.push_back(restored_avg_[i]);
            p.issued.push_back(restored_issued_[i]);
          }
        p.done = true;
        pending_.push_back(std::move(p));
        break;
      }
    }
    restored_avg_.clear();
    restored_issued_.clear();
  }
  while (!pending_.empty() && pending_.front().due <= step) {
    complete(pending_.front(), wait);
    apply(pending_.front());
    pending_.pop_front();
  }
  std::vector<int> synced;
  for (int f = 0; f < rs_.fragments; ++f) {
    if (!due(f, step)) continue;
    Pending p = issue(f, step);
    if (tau == 0) {
      complete(p, wait);
      apply(p);
    } else {
      pending_.push_back(std::move(p));
    }
    synced.push_back(f);
  }
  last_step_ = step;
  return synced;
}

// Fragment f syncs at offset_f, offset_f + H, ... (fragment 0 first at H: step 0 syncs nothing).
int64_t OuterSync::first_sync(int f) const { return offset(f) > 0 ? offset(f) : rs_.inner_steps; }

int64_t OuterSync::sync_index(int f, int64_t step) const { return (step - first_sync(f)) / rs_.inner_steps; }

int OuterSync::fallbacks() const { return static_cast<int>(std::count(fallback_.begin(), fallback_.end(), true)); }

void OuterSync::restore_fallbacks(const std::vector<uint8_t>& flags) {
  ST_CHECK(flags.size() == fallback_.size(), "OuterSync::restore_fallbacks: ", flags.size(), " flags for ",
           fallback_.size(), " fragments");
  for (size_t f = 0; f < flags.size(); ++f) fallback_[f] = flags[f] != 0;
}

int64_t OuterSync::fragment_syncs() const {
  int64_t n = 0;
  for (int f = 0; f < rs_.fragments; ++f)
    if (last_step_ >= first_sync(f)) n += sync_index(f, last_step_) + 1;
  return n;
}

OuterSync::Pending OuterSync::issue(int f, int64_t step) {
  Pending p;
  p.fragment = f;
  p.due = step + rs_.overlap_steps;
  const bool replicas = replicate_ && replicate_->size() > 1;
  const WireFormat format = fallback_[f] ? WireFormat::Fp32 : rs_.outer_dtype;
  // The guard: every guard_every-th sync of the fragment, while it still runs quantized (the
  // planner's 1 / guard_every of the syncs, plan/traffic.cpp).
  p.guard = replicas && is_quantized(format) && c_.guard_every > 0 && sync_index(f, step) % c_.guard_every == 0;
  for (size_t i = 0; i < flats_.size(); ++i) {
    PerFlat& pf = flats_[i];
    if (pf.fragment != f) continue;
    p.flats.push_back(i);
    // The outer gradient: how far this replica moved away from the outer copy.
    at::Tensor g = at::sub(pf.outer, pf.fp->master());
    if (g.device() != comm_device_) g = g.to(comm_device_);
    if (replicas)
      p.avgs.push_back(wire_average(*replicate_, g, format, c_.block, p.guard, tree_));
    else
      p.result.push_back(std::move(g));  // one replica: its own change is the average
    if (rs_.overlap_steps > 0) p.issued.push_back(pf.fp->master().clone());
  }
  p.done = !replicas;
  return p;
}

void OuterSync::complete(Pending& p, const std::function<void(comm::Work&)>& wait) {
  if (p.done) return;
  double err2 = 0, ref2 = 0;
  const int S = shard_ ? shard_->size() : 1;
  for (size_t k = 0; k < p.avgs.size(); ++k) {
    WireAverage& a = p.avgs[k];
    wait(*a.work);
    if (a.exact_work) wait(*a.exact_work);
    p.result.push_back(a.average());
    if (p.guard) {
      auto [e, r] = squared_error_and_reference(p.result.back(), a.exact_average());
      // A flat whole on every rank of the shard group (the ignored group) counts once in the sum.
      const double w = flats_[p.flats[k]].fp->shard_size() == 1 ? 1.0 / S : 1.0;
      err2 += w * e;
      ref2 += w * r;
    }
  }
  if (p.guard) {
    // The fragment's error over all of its shards: summed over the shard group, so every rank
    // decides the same (the replicas hold the same averages already).
    at::Tensor t = at::tensor({err2, ref2}, at::TensorOptions().dtype(at::kDouble)).to(comm_device_);
    if (shard_ && shard_->size() > 1) wait(*sum_across(*shard_, t));
    t = t.cpu();
    const double rel = relative_error(t.data_ptr<double>()[0], t.data_ptr<double>()[1]);
    guard_rel_error_ = rel;
    ++guard_checks_;
    if (rel > c_.guard_threshold) {
      // This sync takes the exact average; the fragment runs in fp32 from now on.
      for (size_t k = 0; k < p.avgs.size(); ++k) p.result[k] = p.avgs[k].exact_average();
      fallback_[p.fragment] = true;
      // One warning for the job: every rank decided the same.
      if ((!shard_ || shard_->rank() == 0) && (!replicate_ || replicate_->rank() == 0))
        log::warn(log::fmt("accuracy guard: the ", wire_format_name(rs_.outer_dtype), " outer average of diloco fragment ",
                         p.fragment, " has relative error ", rel, " > fsdp.quant_guard_threshold = ",
                         c_.guard_threshold, ": it runs in fp32 from now on"));
    }
  }
  p.avgs.clear();
  p.done = true;
}

void OuterSync::apply(const Pending& p) {
  const optim::OuterSGDConfig cfg{static_cast<float>(rs_.outer_lr), static_cast<float>(rs_.outer_momentum),
                                  rs_.nesterov};
  const bool overlapped = !p.issued.empty();
  for (size_t k = 0; k < p.flats.size(); ++k) {
    PerFlat& pf = flats_[p.flats[k]];
    const at::Tensor& avg = p.result[k];
    at::Tensor g = avg.device() == pf.outer.device() ? avg : avg.to(pf.outer.device());
    at::Tensor& master = pf.fp->write_master();  // the next forward re-gathers
    if (pf.outer.device().is_cpu()) {
      // Without overlap the kernel writes the master (= the new outer copy) itself.
      optim::outer_sgd_step(pf.outer.data_ptr<float>(), pf.momentum.data_ptr<float>(), g.contiguous().data_ptr<float>(),
                            overlapped ? nullptr : master.data_ptr<float>(), pf.outer.numel(), cfg);
    } else {
      // Device masters: libtorch operations in the kernel's order.
      pf.momentum.mul_(cfg.momentum).add_(g);
      const at::Tensor u = cfg.nesterov ? at::add(g, pf.momentum, cfg.momentum) : pf.momentum;
      pf.outer.add_(u, -cfg.lr);
      if (!overlapped) master.copy_(pf.outer);
    }
    // Overlapped: the replica keeps what it learnt since the issue on top of the new outer copy.
    if (overlapped) master.sub_(p.issued[k]).add_(pf.outer);
  }
}

void OuterSync::finish_in_flight(const std::function<void(comm::Work&)>& wait) {
  for (Pending& p : pending_) complete(p, wait);
}

at::Tensor OuterSync::pending_average(size_t i) const {
  for (const Pending& p : pending_)
    for (size_t k = 0; k < p.flats.size(); ++k)
      if (p.flats[k] == i) return p.result[k];
  return at::zeros_like(flats_.at(i).outer);
}

at::Tensor OuterSync::issued_master(size_t i) const {
  for (const Pending& p : pending_)
    for (size_t k = 0; k < p.flats.size(); ++k)
      if (p.flats[k] == i) return p.issued[k];
  return at::zeros_like(flats_.at(i).outer);
}

void OuterSync::restore(bool saved, const std::vector<at::Tensor>& averages, const std::vector<at::Tensor>& issued) {
  pending_.clear();
  restored_avg_.clear();
  restored_issued_.clear();
  if (!saved || rs_.overlap_steps == 0) return;
  for (size_t i = 0; i < flats_.size(); ++i) {
    restored_avg_.push_back(averages.at(i).to(flats_[i].outer.device()).clone());
    restored_issued_.push_back(issued.at(i).to(flats_[i].outer.device()).clone());
  }
}

void OuterSync::wait_all() {
  for (Pending& p : pending_)
    for (const WireAverage& a : p.avgs) a.wait();
}

}  // namespace shardtrain::fsdp
