// ShardedOptimizer: per-shard fused optimizer state and the decay masks over flat layouts.
#include "shardtrain/fsdp/sharded_optimizer.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "shardtrain/fsdp/device.h"
#include "shardtrain/optim/adamw_cuda.h"
#include "shardtrain/util/choices.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/names.h"

namespace shardtrain::fsdp {

static_assert(static_cast<int>(OptimizerKind::Sgd) + 1 == static_cast<int>(choices::kOptimizers.size()));

OptimizerKind parse_optimizer(const std::string& name) {
  const int i = choices::index_of(choices::kOptimizers, name);
  ST_USER_CHECK(i >= 0, "unknown optimizer.name '", name, "' (", choices::joined(choices::kOptimizers), ")");
  return static_cast<OptimizerKind>(i);
}

optim::DecayMask shard_decay_mask(const FlatParam& fp, const std::vector<std::string>& no_decay) {
  std::vector<optim::ElementRange> ranges;
  for (const auto& s : fp.slots()) {
    if (!matches_any(s.name, no_decay)) ranges.push_back({s.offset, s.offset + s.numel});
  }
  const int64_t begin = fp.shard_rank() * fp.shard_numel();
  return optim::DecayMask(std::move(ranges)).restrict_to(begin, begin + fp.shard_numel());
}

ShardedOptimizer::ShardedOptimizer(Engine& engine, OptimizerConfig cfg)
    : engine_(engine), cfg_(std::move(cfg)), kind_(parse_optimizer(cfg_.name)), flats_(engine.flat_params()) {
  on_device_ = cfg_.state_as_tensors || (!flats_.empty() && !flats_.front()->master().device().is_cpu());
  if (on_device_) {
    if (kind_ == OptimizerKind::AdamW) cfg_.adamw.validate();
    else cfg_.sgd.validate();
    for (FlatParam* fp : flats_) {
      masks_.push_back(fp->frozen() ? optim::DecayMask::none() : shard_decay_mask(*fp, cfg_.no_decay));
      DeviceState d;
      if (fp->frozen()) {  // no state: an empty entry keeps the indices those of engine.flat_params()
        dev_.push_back(std::move(d));
        continue;
      }
      if (kind_ == OptimizerKind::AdamW) {
        const std::vector<int64_t> b = optim::decay_bounds(masks_.back(), cfg_.adamw);
        d.exp_avg = at::zeros_like(fp->master());
        d.exp_avg_sq = at::zeros_like(fp->master());
        d.bounds = at::tensor(at::ArrayRef<int64_t>(b), at::TensorOptions().dtype(at::kLong)).to(fp->master().device());
      } else if (cfg_.sgd.momentum != 0.0f) {
        d.momentum = at::zeros_like(fp->master());
      }
      dev_.push_back(std::move(d));
    }
    return;
  }
  for (FlatParam* fp : flats_) {
    // A frozen flat: a kernel over no elements, so the indices stay those of engine.flat_params().
    const int64_t n = fp->frozen() ? 0 : fp->shard_numel();
    masks_.push_back(fp->frozen() ? optim::DecayMask::none() : shard_decay_mask(*fp, cfg_.no_decay));
    if (kind_ == OptimizerKind::AdamW)
      adamw_.push_back(std::make_unique<optim::FusedAdamW>(n, cfg_.adamw));
    else
      sgd_.push_back(std::make_unique<optim::FusedSGD>(n, cfg_.sgd));
  }
}

void ShardedOptimizer::step_host_threaded(float lr) {
  // Chunks of about 1/(4 threads) of all elements, cut at flat boundaries; each runs the Kokkos
  // kernel (Serial: a plain loop on the calling thread, no shared state) on its element range.
  struct Chunk {
    size_t flat;
    int64_t begin, end;
  };
  int64_t total = 0;
  for (FlatParam* fp : flats_)
    if (!fp->frozen()) total += fp->shard_numel();
  const int threads = host_threads();
  const int64_t target = std::max<int64_t>(1 << 16, total / (4 * threads) + 1);
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < flats_.size(); ++i)
    for (int64_t b = 0; !flats_[i]->frozen() && b < flats_[i]->shard_numel(); b += target)
      chunks.push_back({i, b, std::min(flats_[i]->shard_numel(), b + target)});
  const int64_t step = adamw_.front()->steps_taken() + 1;
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < chunks.size();) {
      const Chunk& c = chunks[k];
      FlatParam& fp = *flats_[c.flat];
      optim::FusedAdamW& o = *adamw_[c.flat];
      try {
        optim::adamw_step(fp.master().data_ptr<float>() + c.begin, fp.grad_shard().data_ptr<float>() + c.begin,
                          o.exp_avg() + c.begin, o.exp_avg_sq() + c.begin, c.end - c.begin,
                          masks_[c.flat].restrict_to(c.begin, c.end), o.config(), lr, step);
      } catch (...) {
        std::lock_guard<std::mutex> l(error_mu);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  for (auto& o : adamw_) o->set_steps_taken(step);
}

int ShardedOptimizer::host_threads() const {
  return cfg_.host_threads > 0 ? cfg_.host_threads : std::max(1, at::get_num_threads());
}

void ShardedOptimizer::step_on_device(float lr) {
  const int64_t step = device_steps_ + 1;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < flats_.size(); ++i) {
    FlatParam& fp = *flats_[i];
    DeviceState& d = dev_[i];
    if (fp.frozen()) continue;
    if (kind_ == OptimizerKind::Sgd) {
      // The Kokkos kernel's operations (sgd.cpp), as tensor operations: the decayed ranges take
      // d = g + wd*p, then the momentum buffer (a copy of d on the first step), then p -= lr*d.
      const optim::SGDConfig& c = cfg_.sgd;
      at::Tensor dp = fp.grad_shard();
      if (c.weight_decay != 0.0f && !masks_[i].ranges().empty()) {
        dp = dp.clone();
        for (const auto& r : masks_[i].ranges())
          dp.narrow(0, r.begin, r.size()).add_(fp.master().narrow(0, r.begin, r.size()), c.weight_decay);
      }
      if (c.momentum != 0.0f) {
        if (step == 1) d.momentum.copy_(dp);
        else d.momentum.mul_(c.momentum).add_(dp);
        dp = c.nesterov ? dp.add(d.momentum, c.momentum) : d.momentum;
      }
      fp.write_master().add_(dp, -lr);
      continue;
    }
    const optim::AdamWScalars s = optim::adamw_scalars(cfg_.adamw, lr, step);
    if (optim::adamw_cuda_built() && fp.master().is_cuda()) {
      optim::adamw_step_cuda(fp.write_master().data_ptr<float>(), fp.grad_shard().data_ptr<float>(),
                             d.exp_avg.data_ptr<float>(), d.exp_avg_sq.data_ptr<float>(), fp.shard_numel(),
                             d.bounds.data_ptr<int64_t>(), d.bounds.numel(), s,
                             current_cuda_stream(fp.master().device()));
      continue;
    }
    // No nvcc in this build (or a host master): the kernel's update in libtorch operations, in
    // its operation order (rounding may differ: no fused multiply-add control).
    if (cfg_.adamw.weight_decay != 0.0f)
      for (const auto& r : masks_[i].ranges()) fp.write_master().narrow(0, r.begin, r.size()).mul_(s.decay_factor);
    d.exp_avg.mul_(s.beta1).add_(fp.grad_shard(), s.one_minus_beta1);
    d.exp_avg_sq.mul_(s.beta2).addcmul_(fp.grad_shard(), fp.grad_shard(), s.one_minus_beta2);
    fp.write_master().addcdiv_(d.exp_avg, d.exp_avg_sq.sqrt().add_(s.eps_scaled), s.neg_step_size);
  }
  device_steps_ = step;
}

void ShardedOptimizer::step(float lr) {
  // Every master changes: each is taken for writing here, on this thread (the host kernels
  // write from several), which tells its flat that the next forward must gather it again.
  for (FlatParam* fp : flats_)
    if (!fp->frozen()) fp->write_master();
  if (on_device_) {
    step_on_device(lr);
    return;
  }
  if (kind_ == OptimizerKind::AdamW && !flats_.empty() && host_threads() > 1) {
    step_host_threaded(lr);
    return;
  }
  for (size_t i = 0; i < flats_.size(); ++i) {
    FlatParam& fp = *flats_[i];
    if (fp.frozen()) {  // nothing to step; the step count stays the same on every kernel
      if (kind_ == OptimizerKind::AdamW) adamw_[i]->set_steps_taken(adamw_[i]->steps_taken() + 1);
      else sgd_[i]->set_steps_taken(sgd_[i]->steps_taken() + 1);
      continue;
    }
    float* p = fp.write_master().data_ptr<float>();
    const float* g = fp.grad_shard().data_ptr<float>();
    if (kind_ == OptimizerKind::AdamW)
      adamw_[i]->step(p, g, fp.shard_numel(), masks_[i], lr);
    else
      sgd_[i]->step(p, g, fp.shard_numel(), masks_[i], lr);
  }
}

int64_t ShardedOptimizer::steps_taken() const {
  if (on_device_) return device_steps_;
  if (flats_.empty()) return 0;
  return kind_ == OptimizerKind::AdamW ? adamw_[0]->steps_taken() : sgd_[0]->steps_taken();
}

void ShardedOptimizer::set_steps_taken(int64_t steps) {
  ST_CHECK(steps >= 0, "negative step count ", steps);
  device_steps_ = steps;
  for (auto& o : adamw_) o->set_steps_taken(steps);
  for (auto& o : sgd_) o->set_steps_taken(steps);
}

int64_t ShardedOptimizer::state_bytes() const {
  int64_t b = 0;
  for (auto& d : dev_)
    for (const at::Tensor* t : {&d.exp_avg, &d.exp_avg_sq, &d.momentum})
      if (t->defined()) b += t->numel() * 4;
  for (auto& o : adamw_) b += 2 * o->size() * 4;
  for (auto& o : sgd_) b += (o->config().momentum != 0 ? o->size() * 4 : 0);
  return b;
}

std::vector<std::string> ShardedOptimizer::state_names() const {
  if (kind_ == OptimizerKind::AdamW) return {"exp_avg", "exp_avg_sq"};
  if (cfg_.sgd.momentum != 0) return {"momentum"};
  return {};
}

at::Tensor ShardedOptimizer::state_tensor(size_t flat_index, size_t state_index) {
  ST_CHECK(state_index < state_names().size(), "optimizer state ", state_index, " of ", state_names().size());
  if (flats_.at(flat_index)->frozen()) return at::empty({0}, at::TensorOptions().dtype(at::kFloat));
  if (on_device_) {
    const DeviceState& d = dev_.at(flat_index);
    if (kind_ == OptimizerKind::Sgd) return d.momentum;
    return state_index == 0 ? d.exp_avg : d.exp_avg_sq;
  }
  return at::from_blob(state(flat_index, state_index), {flats_.at(flat_index)->shard_numel()},
                       at::TensorOptions().dtype(at::kFloat));
}

float* ShardedOptimizer::state(size_t flat_index, size_t state_index) {
  if (on_device_) {
    at::Tensor t = state_tensor(flat_index, state_index);
    ST_CHECK(t.device().is_cpu(), "optimizer state lives on ", t.device().str(),
             ": copy through state_tensor() (checkpoints stage it in host memory)");
    return t.data_ptr<float>();
  }
  if (kind_ == OptimizerKind::AdamW)
    return state_index == 0 ? adamw_.at(flat_index)->exp_avg() : adamw_.at(flat_index)->exp_avg_sq();
  return sgd_.at(flat_index)->momentum_buffer();
}

}  // namespace shardtrain::fsdp
