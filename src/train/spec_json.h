// model_spec_json: the ModelSpec as a JSON object, written into checkpoints (CheckpointInfo).
// Read back by the model_io layer (model_io/spec_from_json.h).
#pragma once
#include <string>

#include "shardtrain/model/model.h"

namespace shardtrain::train {
// Every field of the spec, so a checkpoint says which model it holds without the deck.
std::string model_spec_json(const model::ModelSpec& s);
}  // namespace shardtrain::train
