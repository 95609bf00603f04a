// model_spec_json: ModelSpec -> JSON (informational; loading checks shapes, not this text).
#include "spec_json.h"

#include <nlohmann/json.hpp>

#include "shardtrain/deck/deck.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/small_file.h"

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

model::ModelSpec model_spec_from_json(const std::string& text, const std::string& what) {
  check_json_depth(text, kMaxJsonDepth, what + ": model_spec");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw UserError(what + ": model_spec is not a JSON object (" + std::to_string(text.size()) + " bytes)");
  model::ModelSpec s;
  // Each size within the deck key's range, so a crafted spec cannot build a gigantic model.
  auto take_int = [&](const char* name, int64_t& field) {
    if (!j.contains(name)) return;
    const nlohmann::json& v = j[name];
    const deck::KeySpec* k = deck::find_key(std::string("model.") + name);
    const bool ok = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > (uint64_t{1} << 62)) &&
                    (!k || ((!k->has_min || v.get<int64_t>() >= k->min) && (!k->has_max || v.get<int64_t>() <= k->max)));
    if (!ok) throw UserError(what + ": model_spec " + name + " = " + v.dump() + " is not a valid model." + name);
    field = v.get<int64_t>();
  };
  auto take_float = [&](const char* name, double& field) {
    if (!j.contains(name)) return;
    if (!j[name].is_number()) throw UserError(what + ": model_spec " + name + " = " + j[name].dump() + " is not a number");
    field = j[name].get<double>();
  };
  if (j.contains("arch")) {
    if (!j["arch"].is_string()) throw UserError(what + ": model_spec arch is not a string");
    s.arch = j["arch"].get<std::string>();
  }
  take_int("vocab_size", s.vocab_size);
  take_int("seq_len", s.seq_len);
  take_int("d_model", s.d_model);
  take_int("n_layers", s.n_layers);
  take_int("n_heads", s.n_heads);
  take_int("n_kv_heads", s.n_kv_heads);
  take_int("d_ff", s.d_ff);
  take_float("norm_eps", s.norm_eps);
  take_float("rope_theta", s.rope_theta);
  if (j.contains("tie_embeddings")) {
    if (!j["tie_embeddings"].is_boolean()) throw UserError(what + ": model_spec tie_embeddings is not a boolean");
    s.tie_embeddings = j["tie_embeddings"].get<bool>();
  }
  take_float("dropout", s.dropout);
  take_int("image_size", s.image_size);
  take_int("patch_size", s.patch_size);
  take_int("channels", s.channels);
  take_int("num_classes", s.num_classes);
  if (s.arch != "gpt2" && s.arch != "llama" && s.arch != "vit")
    throw UserError(what + ": model_spec arch '" + s.arch + "' is not gpt2, llama or vit");
  return model::resolve_spec(s);
}

}  // namespace shardtrain::train
