// spec_overrides / model_spec_from_json: a checkpoint's recorded ModelSpec back to deck
// overrides and to a ModelSpec, each field bounded by its deck key.
#include "spec_from_json.h"

#include <nlohmann/json.hpp>

#include <cstdio>

#include "shardtrain/deck/deck.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::model_io {

std::vector<std::string> spec_overrides(const model::ModelSpec& s) {
  auto quoted = [](const std::string& v) {
    std::string q = "\"";
    for (char c : v) {
      if (c == '"' || c == '\\') q += '\\';
      q += c;
    }
    return q + "\"";
  };
  std::vector<std::string> o = {"model.arch=" + quoted(s.arch), "model.preset=\"\""};
  const bool images = model::input_kind(s) == model::InputKind::Images;
  for (const model::SpecField& f : model::spec_fields()) {
    if ((f.images_only && !images) || (f.llama_only && s.arch != "llama")) continue;
    std::string v;
    if (f.int_field) v = std::to_string(s.*f.int_field);
    if (f.float_field) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", s.*f.float_field);  // round-trips every double
      v = buf;
      if (v.find_first_of(".eEn") == std::string::npos) v += ".0";  // TOML: a float, not an integer
    }
    if (f.bool_field) v = s.*f.bool_field ? "true" : "false";
    if (f.string_field) v = quoted(s.*f.string_field);
    o.push_back(std::string("model.") + f.name + "=" + v);
  }
  return o;
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
  for (const model::SpecField& f : model::spec_fields()) {
    if (f.int_field) take_int(f.name, s.*f.int_field);
    if (f.float_field) take_float(f.name, s.*f.float_field);
    if (f.bool_field && j.contains(f.name)) {
      if (!j[f.name].is_boolean()) throw UserError(what + ": model_spec " + f.name + " is not a boolean");
      s.*f.bool_field = j[f.name].get<bool>();
    }
    if (f.string_field && j.contains(f.name)) {
      if (!j[f.name].is_string() || j[f.name].get<std::string>().size() > 4096)
        throw UserError(what + ": model_spec " + f.name + " is not a (short) string");
      s.*f.string_field = j[f.name].get<std::string>();
    }
  }
  try {
    model::input_kind(s);  // an architecture the model layer knows
    return model::resolve_spec(s);  // its sizes fit together and within the limits (model_sizes.h)
  } catch (const UserError& e) {
    throw UserError(what + ": model_spec: " + e.what());
  }
}

}  // namespace shardtrain::model_io
