// model_spec_json: ModelSpec -> JSON (informational; loading checks shapes, not this text).
#include "spec_json.h"

#include <nlohmann/json.hpp>

namespace shardtrain::train {

std::string model_spec_json(const model::ModelSpec& s) {
  nlohmann::json j = {{"arch", s.arch},         {"vocab_size", s.vocab_size}, {"seq_len", s.seq_len},
                      {"d_model", s.d_model},   {"n_layers", s.n_layers},     {"n_heads", s.n_heads},
                      {"n_kv_heads", s.n_kv_heads}, {"d_ff", s.d_ff},        {"norm_eps", s.norm_eps},
                      {"rope_theta", s.rope_theta}, {"tie_embeddings", s.tie_embeddings},
                      {"dropout", s.dropout}};
  if (model::input_kind(s) == model::InputKind::Images) {
    j["image_size"] = s.image_size;
    j["patch_size"] = s.patch_size;
    j["channels"] = s.channels;
    j["num_classes"] = s.num_classes;
  }
  return j.dump();
}

}  // namespace shardtrain::train
