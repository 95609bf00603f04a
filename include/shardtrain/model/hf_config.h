// Hugging Face config.json <-> ModelSpec: the model of a downloaded LlamaForCausalLM,
// MistralForCausalLM or Qwen2ForCausalLM directory (the llama arch), and the config.json and
// generation_config.json an exported directory carries.
#pragma once
#include <string>
#include <vector>

#include "shardtrain/model/model.h"

namespace shardtrain::model {

// What config.json says, as a spec (not resolved: the deck may still set seq_len and dropout).
struct HfConfig {
  std::string path;  // the config.json read
  ModelSpec spec;    // seq_len = max_position_embeddings, capped at sliding_window when there is one
  // Per spec field (SpecField::name, and "arch"): the config.json key it comes from, e.g.
  // {"d_model", "hidden_size"}; "(default)" is appended when config.json does not give the key
  // and transformers' default for the architecture applies.
  std::vector<std::pair<std::string, std::string>> sources;
  std::string source_of(const std::string& field) const;
};

// `dir_or_file`: a model directory (its config.json) or the path of a config.json.
std::string hf_config_path(const std::string& dir_or_file);
// Whether `dir_or_file` is a directory holding a config.json, or a .json file named config.json.
bool has_hf_config(const std::string& dir_or_file);

// Reads and checks config.json. UserError naming the file and the key on anything missing,
// mistyped or unsupported: an architecture other than the three, hidden_act other than silu,
// a rope_scaling type other than default / linear / llama3, a truncated or garbage file.
HfConfig read_hf_config(const std::string& dir_or_file);

// config.json of a resolved llama spec (architectures = spec.hf_architecture or
// LlamaForCausalLM), readable back by read_hf_config into the same spec (seq_len aside) and
// by transformers. `torch_dtype`: the dtype the weights are written in ("bfloat16", ...).
std::string hf_config_json(const ModelSpec& resolved, const std::string& torch_dtype);
// generation_config.json: bos/eos token ids of the spec.
std::string hf_generation_config_json(const ModelSpec& resolved);

}  // namespace shardtrain::model
