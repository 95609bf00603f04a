// ShardedOptimizer: per-shard fused optimizer state and the decay masks over flat layouts.
#include "shardtrain/fsdp/sharded_optimizer.h"

#include "shardtrain/util/error.h"

namespace shardtrain::fsdp {

optim::DecayMask shard_decay_mask(const FlatParam& fp, const std::vector<std::string>& no_decay) {
  std::vector<optim::ElementRange> ranges;
  for (const auto& s : fp.slots) {
    bool decays = true;
    for (const auto& p : no_decay)
      if (!p.empty() && s.name.find(p) != std::string::npos) decays = false;
    if (decays) ranges.push_back({s.offset, s.offset + s.numel});
  }
  const int64_t begin = fp.shard_rank * fp.shard_numel;
  return optim::DecayMask(std::move(ranges)).restrict_to(begin, begin + fp.shard_numel);
}

ShardedOptimizer::ShardedOptimizer(Engine& engine, OptimizerConfig cfg)
    : engine_(engine), cfg_(std::move(cfg)), flats_(engine.flat_params()) {
  ST_USER_CHECK(cfg_.name == "adamw" || cfg_.name == "sgd", "unknown optimizer.name '", cfg_.name,
                "' (adamw, sgd)");
  for (FlatParam* fp : flats_) {
    masks_.push_back(shard_decay_mask(*fp, cfg_.no_decay));
    if (cfg_.name == "adamw")
      adamw_.push_back(std::make_unique<optim::FusedAdamW>(fp->shard_numel, cfg_.adamw));
    else
      sgd_.push_back(std::make_unique<optim::FusedSGD>(fp->shard_numel, cfg_.sgd));
  }
}

void ShardedOptimizer::step(float lr) {
  for (size_t i = 0; i < flats_.size(); ++i) {
    FlatParam& fp = *flats_[i];
    float* p = fp.master.data_ptr<float>();
    const float* g = fp.grad_shard.data_ptr<float>();
    if (!adamw_.empty())
      adamw_[i]->step(p, g, fp.shard_numel, masks_[i], lr);
    else
      sgd_[i]->step(p, g, fp.shard_numel, masks_[i], lr);
  }
  engine_.mark_params_updated();
}

int64_t ShardedOptimizer::steps_taken() const {
  if (!adamw_.empty()) return adamw_[0]->steps_taken();
  if (!sgd_.empty()) return sgd_[0]->steps_taken();
  return 0;
}

void ShardedOptimizer::set_steps_taken(int64_t steps) {
  for (auto& o : adamw_) o->set_steps_taken(steps);
  for (auto& o : sgd_) o->set_steps_taken(steps);
}

int64_t ShardedOptimizer::state_bytes() const {
  int64_t b = 0;
  for (auto& o : adamw_) b += 2 * o->size() * 4;
  for (auto& o : sgd_) b += (o->config().momentum != 0 ? o->size() * 4 : 0);
  return b;
}

std::vector<std::string> ShardedOptimizer::state_names() const {
  if (!adamw_.empty()) return {"exp_avg", "exp_avg_sq"};
  if (!sgd_.empty() && cfg_.sgd.momentum != 0) return {"momentum"};
  return {};
}

float* ShardedOptimizer::state(size_t flat_index, size_t state_index) {
  if (!adamw_.empty())
    return state_index == 0 ? adamw_.at(flat_index)->exp_avg() : adamw_.at(flat_index)->exp_avg_sq();
  return sgd_.at(flat_index)->momentum_buffer();
}

}  // namespace shardtrain::fsdp
