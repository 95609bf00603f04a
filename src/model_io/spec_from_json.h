// A checkpoint's recorded model spec (its model_spec attribute, train/spec_json.h) read back: the
// ModelSpec, and the deck overrides that build exactly that model.
#pragma once
#include <string>
#include <vector>

#include "shardtrain/model/model.h"

namespace shardtrain::model_io {
// The inverse of train::model_spec_json, for tools that rebuild a checkpoint's model (ckpt export
// checks its tensors): every size within its deck key's range, then model::resolve_spec.
// UserError naming `what`.
// The recorded finetune (LoRA, train.freeze) as deck overrides (lora.*, train.freeze), with
// lora.init_from cleared: an adapter checkpoint holds the adapters it started from.
std::vector<std::string> finetune_overrides(const model::ModelSpec& s);

model::ModelSpec model_spec_from_json(const std::string& text, const std::string& what);
// The spec as deck overrides ("model.arch=\"llama\"", "model.d_model=64", ...; floats to the
// bit): a deck that sets them builds exactly this model (checkpoint_deck uses it).
std::vector<std::string> spec_overrides(const model::ModelSpec& s);
}  // namespace shardtrain::model_io
