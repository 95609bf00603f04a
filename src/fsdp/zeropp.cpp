// ZeroPP: the state of the quantized weight all-gather, the quantized replica average with error
// feedback, the secondary shards and the accuracy guard (see zeropp.h; the collectives are
// collectives.h's, the wire format quantize.h's).
#include "zeropp.h"

#include <algorithm>

#include "shardtrain/fsdp/quantize.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/log.h"

namespace shardtrain::fsdp {

ZeroPP::ZeroPP(const Compression& c, const c10::Device& device, comm::Comm* node)
    : c_(c), device_(device), node_(node) {
  ST_CHECK(c_.block >= 1, "quantization block must be >= 1, got ", c_.block);
}

void ZeroPP::warn_fallback(const char* what, const FlatParam& fp, double rel) {
  const std::string first = fp.slots().empty() ? std::string("?") : fp.slots().front().name;
  log::warn(log::fmt("accuracy guard: the quantized ", what, " of the flat starting at '", first, "' (",
                     fp.numel(), " values) has relative error ", rel, " > fsdp.quant_guard_threshold = ",
                     c_.guard_threshold, " at step ", step_, ": it runs in full precision from now on"));
}

void ZeroPP::begin_record() {
  if (recorded_step_ == step_) return;
  recorded_step_ = step_;
  stats_.weight_rel_error = stats_.grad_rel_error = -1;
}

void ZeroPP::keep_secondary(const std::vector<std::unique_ptr<FlatParam>>& flats, MemoryStats& ms) {
  if (!c_.secondary_shards || !node_) return;
  const int G = node_->size(), l = node_->rank();
  for (auto& fp : flats) {
    // An NF4 flat is gathered as codes again: cheaper than a secondary shard in the compute dtype.
    if (fp->aliases_master() || fp->nf4() || fp->shard_size() == 1 || fp->state() != FlatParam::State::Unsharded) continue;
    ST_CHECK(fp->padded() % G == 0, "secondary shard: ", fp->padded(), " elements over ", G, " ranks of the node");
    const int64_t chunk = fp->padded() / G;
    drop_secondary(*fp, ms);
    secondary_[fp.get()] = storage_alias(fp->full(), 0, {fp->padded()}).narrow(0, l * chunk, chunk).clone();
    ms.live_secondary_bytes += chunk * static_cast<int64_t>(c10::elementSize(fp->dtype()));
  }
  ms.peak_secondary_bytes = std::max(ms.peak_secondary_bytes, ms.live_secondary_bytes);
}

void ZeroPP::drop_secondary(const FlatParam& fp, MemoryStats& ms) {
  auto it = secondary_.find(&fp);
  if (it == secondary_.end()) return;
  ms.live_secondary_bytes -= it->second.numel() * static_cast<int64_t>(c10::elementSize(fp.dtype()));
  secondary_.erase(it);
}

comm::WorkPtr ZeroPP::gather(comm::Comm& shard, FlatParam& fp, const at::Tensor& mine, bool quantizable,
                             bool backward, MemoryStats& ms) {
  if (auto it = secondary_.find(&fp); it != secondary_.end()) {
    if (backward) {
      // hpZ: the weights forward used, gathered from the node's secondary shards.
      comm::WorkPtr w = all_gather_from_secondary(*node_, fp, it->second);
      drop_secondary(fp, ms);
      return w;
    }
    drop_secondary(fp, ms);  // left from a forward without backward: the masters may have changed
  }
  if (!c_.quantize_weights || !quantizable || flat_[&fp].weights_fallback) return all_gather_flat(shard, fp, mine);
  PerFlat& pf = flat_[&fp];
  if (pf.packed_step != step_ || !pf.packed.defined()) {
    if (!pf.packed.defined())
      pf.packed = at::empty({quantized_bytes(fp.shard_numel(), c_.block)}, fp.master().options().dtype(at::kByte));
    quantize_into(fp.master(), pf.packed, c_.block);
    pf.packed_step = step_;
  }
  FlatParam* f = &fp;
  return quantized_all_gather_flat(shard, fp, pf.packed, c_.block, guard_step(), [this, f](double rel) {
    begin_record();
    ++stats_.guard_checks;
    stats_.weight_rel_error = std::max(stats_.weight_rel_error, rel);
    if (!(rel > c_.guard_threshold)) return false;
    flat_[f].weights_fallback = true;
    ++stats_.weight_fallbacks;
    warn_fallback("weight all-gather", *f, rel);
    return true;
  });
}

void ZeroPP::fallbacks(const std::vector<FlatParam*>& flats, std::vector<uint8_t>& weights,
                       std::vector<uint8_t>& grads) const {
  weights.assign(flats.size(), 0);
  grads.assign(flats.size(), 0);
  for (size_t i = 0; i < flats.size(); ++i) {
    auto it = flat_.find(flats[i]);
    if (it == flat_.end()) continue;
    weights[i] = it->second.weights_fallback;
    grads[i] = it->second.grads_fallback;
  }
}

void ZeroPP::restore(const std::vector<FlatParam*>& flats, const std::vector<uint8_t>& weights,
                     const std::vector<uint8_t>& grads, int64_t steps) {
  ST_CHECK(weights.size() == flats.size() && grads.size() == flats.size(), "ZeroPP::restore: ", weights.size(), "/",
           grads.size(), " flags for ", flats.size(), " flats");
  stats_.weight_fallbacks = stats_.grad_fallbacks = 0;
  for (size_t i = 0; i < flats.size(); ++i) {
    PerFlat& f = flat_[flats[i]];
    f.weights_fallback = weights[i] != 0;
    f.grads_fallback = grads[i] != 0;
    stats_.weight_fallbacks += f.weights_fallback;
    stats_.grad_fallbacks += f.grads_fallback;
  }
  step_ = steps;
}

at::Tensor& ZeroPP::residual(FlatParam& fp) {
  PerFlat& f = flat_[&fp];
  if (!f.residual.defined()) f.residual = at::zeros({fp.shard_numel()}, fp.grad_shard().options());
  return f.residual;
}

void ZeroPP::issue_replica_average(std::vector<std::pair<comm::Comm*, FlatParam*>>& shards) {
  if (!c_.quantize_grads) return;
  const bool check = guard_step();
  for (auto& [c, fp] : shards) {
    if (!c || c->size() == 1 || flat_[fp].grads_fallback) continue;
    at::Tensor& e = residual(*fp);
    // x = this step's gradient plus what quantization left out last time (error feedback).
    at::Tensor x = fp->grad_shard() + e;
    pending_.push_back({fp, int8_replica_average(*c, x, e, c_.block, check)});
    c = nullptr;  // averaged here, not by the caller
  }
}

void ZeroPP::finish_replica_average(comm::Comm* shard, const std::function<void(comm::Work&)>& wait) {
  std::vector<double> guard;  // per pending entry: err^2, ref^2
  for (PendingAverage& p : pending_) {
    wait(*p.avg.work);
    if (p.avg.exact_work) wait(*p.avg.exact_work);
    const at::Tensor avg = p.avg.average();
    p.fp->grad_shard().copy_(avg);
    p.avg.wire = at::Tensor();
    if (p.avg.exact.defined()) {
      auto [err, ref] = squared_error_and_reference(avg, p.avg.exact);
      guard.push_back(err);
      guard.push_back(ref);
    }
  }
  if (!guard.empty()) {
    // One unit's error over all of its shards: summed over the shard group, so every rank
    // decides the same (replicas hold the same numbers already).
    at::Tensor t = at::tensor(guard, at::TensorOptions().dtype(at::kDouble)).to(device_);
    if (shard && shard->size() > 1) wait(*sum_across(*shard, t));
    t = t.cpu();
    const double* g = t.data_ptr<double>();
    size_t i = 0;
    for (PendingAverage& p : pending_) {
      if (!p.avg.exact.defined()) continue;
      const double rel = relative_error(g[2 * i], g[2 * i + 1]);
      ++i;
      begin_record();
      ++stats_.guard_checks;
      stats_.grad_rel_error = std::max(stats_.grad_rel_error, rel);
      if (rel > c_.guard_threshold) {
        // The exact average of (gradient + residual) replaces the quantized one; nothing is
        // left to carry.
        p.fp->grad_shard().copy_(p.avg.exact);
        residual(*p.fp).zero_();
        flat_[p.fp].grads_fallback = true;
        ++stats_.grad_fallbacks;
        warn_fallback("gradient average across replicas", *p.fp, rel);
      }
    }
  }
  pending_.clear();
  end_step();
}

}  // namespace shardtrain::fsdp
