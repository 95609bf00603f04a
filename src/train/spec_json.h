// model_spec_json: the ModelSpec as a JSON object, written into checkpoints (CheckpointInfo).
#pragma once
#include <string>

#include "shardtrain/model/model.h"

namespace shardtrain::train {
// Every field of the spec, so a checkpoint says which model it holds without the deck.
std::string model_spec_json(const model::ModelSpec& s);
// The inverse, for tools that rebuild a checkpoint's model (ckpt export checks its tensors):
// every size within its deck key's range, then model::resolve_spec. UserError naming `what`.
model::ModelSpec model_spec_from_json(const std::string& text, const std::string& what);
}  // namespace shardtrain::train
