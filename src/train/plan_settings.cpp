// plan_settings_from_deck: the planner's inputs from a deck.
#include "shardtrain/train/plan_settings.h"

#include <ATen/ATen.h>

#include "shardtrain/train/setup.h"

namespace shardtrain::train {

plan::PlanSettings plan_settings_from_deck(const deck::Deck& d, int ranks, int ranks_per_host) {
  plan::PlanSettings ps;
  ps.spec = model_spec_from_deck(d);
  std::shared_ptr<model::Model> m = model::build_model(ps.spec, at::kMeta);
  // The engine's options, [diloco] included (engine.replica_sync): the keys read once.
  ps.engine = engine_options_from_deck(d, *m, strategy_from_deck(d));
  ps.optimizer = d.get_string("optimizer.name");
  ps.sgd_momentum = d.get_float("optimizer.momentum");
  ps.ranks = ranks;
  ps.ranks_per_host = ranks_per_host;
  ps.shard_group_size = static_cast<int>(d.get_int("parallel.shard_group_size"));
  ps.threads = threads_per_rank(d, ranks_per_host);
  const BatchPlan bp = plan_batches(d, ranks);
  ps.micro_batch = bp.micro_batch;
  ps.grad_accum = bp.grad_accum;
  return ps;
}

}  // namespace shardtrain::train
