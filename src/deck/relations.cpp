// Rules that involve several keys, checked once the file and the overrides are applied.
#include "deck_detail.h"
#include "shardtrain/util/error.h"

namespace shardtrain::deck {

void Deck::check_relations() const {
  // Blame the first of the keys that the user set: that is where the fix goes.
  auto fail = [&](std::initializer_list<const char*> keys, const std::string& msg) {
    std::string loc;
    for (const char* k : keys)
      if (is_set(k)) { loc = origin(k); break; }
    throw UserError((loc.empty() ? source_ : loc) + ": " + msg);
  };
  auto shown = [&](const char* key) { return std::string(key) + " = " + detail::toml_literal(values_.at(key)); };

  if (get_float("lr.min_lr") > get_float("optimizer.lr"))
    fail({"lr.min_lr", "optimizer.lr"}, shown("lr.min_lr") + " exceeds the peak " + shown("optimizer.lr"));

  const std::string& arch = get_string("model.arch");
  const std::string& preset = get_string("model.preset");
  if (!preset.empty() && preset.rfind(arch + "-", 0) != 0)
    fail({"model.preset", "model.arch"}, shown("model.preset") + " does not fit " + shown("model.arch"));
  int64_t heads = get_int("model.n_heads"), kv = get_int("model.n_kv_heads");
  if (kv > 0 && heads % kv != 0)
    fail({"model.n_kv_heads", "model.n_heads"},
         shown("model.n_kv_heads") + " must divide " + shown("model.n_heads"));
  // A preset supplies d_model and n_heads together, so only a hand-made shape is checked here
  // (with an explicit head_dim, or a model from a config.json, the model layer checks it).
  if (preset.empty() && get_int("model.head_dim") == 0 && get_string("model.from_hf").empty() &&
      get_int("model.d_model") % heads != 0)
    fail({"model.n_heads", "model.d_model"}, shown("model.n_heads") + " must divide " + shown("model.d_model"));
  // Shape rules of one architecture (a ViT's patches tiling its image) are the model layer's
  // (model::resolve_spec), which `deck check` and every command that builds a model ask.

  // The batch keys' relation at any world size; the data-parallel ranks' share of it is
  // train::plan_batches' (which knows the world), the leaves' train::plan_leaves'.
  int64_t global = get_int("train.global_batch"), micro = get_int("train.micro_batch");
  int64_t accum = get_int("train.grad_accum");
  int64_t per_rank = micro * (accum > 0 ? accum : 1);
  if (global > 0 && global % per_rank != 0)
    fail({"train.global_batch", "train.micro_batch", "train.grad_accum"},
         shown("train.global_batch") + " is not a multiple of micro_batch * grad_accum = " +
             std::to_string(per_rank));
}

}  // namespace shardtrain::deck
