// plan_settings_from_deck: the planner's inputs from a deck.
#include "shardtrain/train/plan_settings.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "shardtrain/data/packing.h"
#include "shardtrain/data/sampler.h"
#include "shardtrain/train/setup.h"

namespace shardtrain::train {
namespace {
// The windows of the deck's token dataset (data.packing): rows apart bound the attention by the
// longest row (after truncation) and do their rows' work; the stream, synthetic data and images
// fill every position of a window.
plan::Windows planned_windows(const deck::Deck& d, const model::ModelSpec& spec) {
  plan::Windows w;
  if (model::input_kind(spec) != model::InputKind::Tokens) return w;
  const std::string dir = d.get_string("data.dataset");
  const data::PackingOptions p = packing_from_deck(d, dir);
  w.packing = std::string(data::to_string(p.mode)) + (p.document_mask ? " with data.document_mask" : "");
  if (p.mode == data::Packing::Stream) return w;
  const data::TokenDataset ds(dir, "train");
  data::check_packing(ds, spec.seq_len, p);  // the samplers' rules (a dataset without rows: named)
  const data::PackingStats st = data::packing_stats(ds, spec.seq_len, p.mode);
  w.attention_span = std::min(st.max_len, spec.seq_len);
  w.fill = st.fill();
  w.attention_length = st.attention_length();
  return w;
}
}  // namespace

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
  ps.windows = planned_windows(d, ps.spec);
  return ps;
}

}  // namespace shardtrain::train
