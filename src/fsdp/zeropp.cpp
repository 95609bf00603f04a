// ZeroPP: quantized weight all-gather, quantized replica average with error feedback, and the
// accuracy guard (see zeropp.h; the wire format is quantize.h's).
#include "zeropp.h"

#include <cmath>
#include <limits>

#include "collectives.h"
#include "engine_impl.h"
#include "shardtrain/fsdp/quantize.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/log.h"

namespace shardtrain::fsdp {
namespace {

// Squared L2 norm of a - b and of b, in fp64.
std::pair<double, double> err_and_ref(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor bd = b.to(at::kDouble);
  const double err = (a.to(at::kDouble) - bd).pow(2).sum().item<double>();
  const double ref = bd.pow(2).sum().item<double>();
  return {err, ref};
}

// NaN when the exact result is not finite itself (nothing to judge: the trainer's divergence
// guard handles that step); infinite when only the quantized one is not.
double relative(double err2, double ref2) {
  if (!std::isfinite(ref2)) return std::numeric_limits<double>::quiet_NaN();
  if (!std::isfinite(err2)) return std::numeric_limits<double>::infinity();
  if (ref2 == 0) return err2 == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(err2 / ref2);
}

// A wire buffer for S packed vectors of P bytes each (P a multiple of 4), as float16: the comm
// layer moves floating dtypes.
at::Tensor wire_buffer(int S, int64_t P, const at::TensorOptions& o) {
  return at::empty({S * P / 2}, o.dtype(at::kHalf));
}

}  // namespace

// The quantized all-gather of one flat in flight: wait() waits for the wire, dequantizes every
// rank's slice into the flat's unsharded buffer and, on a guard step, compares with the exact
// gather (falling the flat back to full precision above the threshold: this gather then uses
// the exact values too).
class QuantizedGatherWork final : public comm::Work {
 public:
  QuantizedGatherWork(ZeroPP& z, FlatParam& fp, comm::WorkPtr wire_work, at::Tensor wire, comm::WorkPtr exact_work,
                      at::Tensor exact)
      : Work(wire_work->seq()), z_(z), fp_(fp), wire_work_(std::move(wire_work)), wire_(std::move(wire)),
        exact_work_(std::move(exact_work)), exact_(std::move(exact)) {}

  void wait() override {
    if (done_) return;
    wire_work_->wait();
    if (exact_work_) exact_work_->wait();
    done_ = true;
    const int S = fp_.shard_size();
    const int64_t L = fp_.shard_numel(), block = z_.c_.block, P = quantized_bytes(L, block);
    at::Tensor full = storage_alias(fp_.full(), 0, {fp_.padded()});
    for (int r = 0; r < S; ++r) dequantize_into(as_bytes(wire_, r * P, P), L, block, full.narrow(0, r * L, L));
    wire_ = at::Tensor();
    if (!exact_.defined()) return;
    auto [err, ref] = err_and_ref(full, exact_);
    const double rel = relative(err, ref);
    CommStats& st = z_.stats_;
    z_.begin_record();
    ++st.guard_checks;
    st.weight_rel_error = std::max(st.weight_rel_error, rel);
    if (rel > z_.c_.guard_threshold) {
      full.copy_(exact_);
      z_.flat_[&fp_].weights_fallback = true;
      ++st.weight_fallbacks;
      z_.warn_fallback("weight all-gather", fp_, rel);
    }
    exact_ = at::Tensor();
  }
  bool is_completed() override {
    return done_ || (wire_work_->is_completed() && (!exact_work_ || exact_work_->is_completed()));
  }

 private:
  ZeroPP& z_;
  FlatParam& fp_;
  comm::WorkPtr wire_work_;
  at::Tensor wire_;
  comm::WorkPtr exact_work_;
  at::Tensor exact_;
  bool done_ = false;
};

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

comm::WorkPtr Engine::Impl::gather_flat(Unit& u, FlatParam& fp, const at::Tensor& mine) {
  return zpp ? zpp->gather(u, fp, mine, phase == Phase::Backward, stats) : all_gather_flat(*u.shard, fp, mine);
}

void ZeroPP::keep_secondary(Unit& u, MemoryStats& ms) {
  if (!c_.secondary_shards || !node_ || u.is_ignored) return;
  const int G = node_->size(), l = node_->rank();
  for (auto& fp : u.flats) {
    if (fp->aliases_master() || fp->shard_size() == 1 || fp->state() != FlatParam::State::Unsharded) continue;
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

comm::WorkPtr ZeroPP::gather(Unit& u, FlatParam& fp, const at::Tensor& mine, bool backward, MemoryStats& ms) {
  if (secondary_.count(&fp)) {
    if (backward) {
      // hpZ: the weights forward used, gathered from the node's secondary shards.
      const int G = node_->size(), l = node_->rank();
      const int64_t chunk = fp.padded() / G;
      at::Tensor full = storage_alias(fp.full(), 0, {fp.padded()});
      at::Tensor own = full.narrow(0, l * chunk, chunk);
      own.copy_(secondary_[&fp]);
      drop_secondary(fp, ms);
      return node_->all_gather(full, own);
    }
    drop_secondary(fp, ms);  // left from a forward without backward: the masters may have changed
  }
  if (!c_.quantize_weights || u.is_ignored || flat_[&fp].weights_fallback) return all_gather_flat(*u.shard, fp, mine);
  const int S = fp.shard_size(), r = fp.shard_rank();
  const int64_t L = fp.shard_numel(), P = quantized_bytes(L, c_.block);
  at::Tensor wire = wire_buffer(S, P, fp.full().options());
  PerFlat& pf = flat_[&fp];
  if (pf.packed_step != step_ || !pf.packed.defined()) {
    if (!pf.packed.defined()) pf.packed = at::empty({P}, fp.master().options().dtype(at::kByte));
    quantize_into(fp.master(), pf.packed, c_.block);
    pf.packed_step = step_;
  }
  as_bytes(wire, r * P, P).copy_(pf.packed);
  comm::WorkPtr w = u.shard->all_gather(wire, wire.narrow(0, r * P / 2, P / 2));
  comm::WorkPtr exact_work;
  at::Tensor exact;
  if (guard_step()) {
    exact = at::empty({fp.padded()}, fp.full().options());
    exact.narrow(0, r * L, L).copy_(fp.master());
    exact_work = u.shard->all_gather(exact, exact.narrow(0, r * L, L));
  }
  return std::make_shared<QuantizedGatherWork>(*this, fp, std::move(w), std::move(wire), std::move(exact_work),
                                               std::move(exact));
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
    const int R = c->size(), k = c->rank();
    const int64_t L = fp->shard_numel(), P = quantized_bytes(L, c_.block);
    at::Tensor& e = residual(*fp);
    // x = this step's gradient plus what quantization left out last time (error feedback).
    at::Tensor x = fp->grad_shard() + e;
    PendingAverage p;
    p.fp = fp;
    p.replicate = c;
    p.wire = wire_buffer(R, P, fp->grad_shard().options());
    at::Tensor own = as_bytes(p.wire, k * P, P);
    quantize_into(x, own, c_.block);
    // The new residual: x minus what the others will receive from this rank.
    at::sub_out(e, x, dequantize(own, L, c_.block));
    p.work = c->all_gather(p.wire, p.wire.narrow(0, k * P / 2, P / 2));
    if (check) {
      p.exact = x;
      p.exact_work = c->all_reduce(p.exact, comm::ReduceOp::Avg);
    }
    pending_.push_back(std::move(p));
    c = nullptr;  // averaged here, not by the caller
  }
}

void ZeroPP::finish_replica_average(Engine::Impl& m) {
  std::vector<double> guard;  // per pending entry: err^2, ref^2
  for (PendingAverage& p : pending_) {
    m.wait_timed(*p.work);
    if (p.exact_work) m.wait_timed(*p.exact_work);
    const int R = p.replicate->size();
    const int64_t L = p.fp->shard_numel(), P = quantized_bytes(L, c_.block);
    // Summed in fp32 in replica order: every replica computes the same bits.
    at::Tensor sum = at::zeros({L}, p.fp->grad_shard().options());
    for (int r = 0; r < R; ++r) sum.add_(dequantize(as_bytes(p.wire, r * P, P), L, c_.block));
    sum.div_(static_cast<double>(R));
    p.fp->grad_shard().copy_(sum);
    p.wire = at::Tensor();
    if (p.exact.defined()) {
      auto [err, ref] = err_and_ref(sum, p.exact);
      guard.push_back(err);
      guard.push_back(ref);
    }
  }
  if (!guard.empty()) {
    // One unit's error over all of its shards: summed over the shard group, so every rank
    // decides the same (replicas hold the same numbers already).
    at::Tensor t = at::tensor(guard, at::TensorOptions().dtype(at::kDouble)).to(device_);
    if (m.comms.shard && m.comms.shard->size() > 1) m.wait_timed(*m.comms.shard->all_reduce(t, comm::ReduceOp::Sum));
    t = t.cpu();
    const double* g = t.data_ptr<double>();
    size_t i = 0;
    for (PendingAverage& p : pending_) {
      if (!p.exact.defined()) continue;
      const double rel = relative(g[2 * i], g[2 * i + 1]);
      ++i;
      begin_record();
      ++stats_.guard_checks;
      stats_.grad_rel_error = std::max(stats_.grad_rel_error, rel);
      if (rel > c_.guard_threshold) {
        // The exact average of (gradient + residual) replaces the quantized one; nothing is
        // left to carry.
        p.fp->grad_shard().copy_(p.exact);
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
