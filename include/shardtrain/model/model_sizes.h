// check_model_sizes: a ModelSpec's sizes against the one table of limits (util/model_limits.h).
#pragma once
#include <functional>
#include <string>

#include "shardtrain/model/model.h"

namespace shardtrain::model {

// What a spec field is called where the value came from: "model.d_model" for a deck,
// "hidden_size" for a config.json.
using FieldName = std::function<std::string(const std::string& field)>;

// Every size field of `spec` within limits::kModelSizes, and the widths made of two fields (the
// attention width n_heads x head_dim and n_kv_heads x head_dim of a llama, a ViT's patch vector
// channels x patch_size^2 and its patches per image) within limits::kMaxWidth. UserError
// "<where><name> = V exceeds the limit L (...)" on the first that does not hold. Call it before
// anything is computed from the sizes: every product of them is then far from overflowing.
// `name` defaults to "model.<field>".
void check_model_sizes(const ModelSpec& spec, const std::string& where = "", const FieldName& name = {});

}  // namespace shardtrain::model
