// spec_overrides / model_spec_from_json: a checkpoint's recorded ModelSpec back to deck
// overrides and to a ModelSpec, each field bounded by its deck key.
#include "spec_from_json.h"

#include <nlohmann/json.hpp>

#include <cstdio>

#include "shardtrain/deck/deck.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::model_io {

namespace {
std::string toml_string(const std::string& v) {
  std::string q = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}
}  // namespace

std::vector<std::string> spec_overrides(const model::ModelSpec& s) {
  const auto quoted = toml_string;
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

std::vector<std::string> finetune_overrides(const model::ModelSpec& s) {
  auto list = [](const std::vector<std::string>& v) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + toml_string(v[i]);
    return out + "]";
  };
  auto number = [](double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", x);
    std::string v = buf;
    if (v.find_first_of(".eEn") == std::string::npos) v += ".0";
    return v;
  };
  const model::Finetune& f = s.finetune;
  std::vector<std::string> o = {"lora.rank=" + std::to_string(f.lora.rank), "lora.alpha=" + number(f.lora.alpha),
          "lora.dropout=" + number(f.lora.dropout), std::string("lora.rslora=") + (f.lora.rslora ? "true" : "false"),
          "lora.targets=" + list(f.lora.targets), "lora.train_also=" + list(f.train_also),
          "train.freeze=" + list(f.freeze), "lora.init_from=\"\"",
          std::string("lora.base_dtype=") + (f.lora.nf4() ? "\"nf4\"" : "\"param_dtype\"")};
  if (f.lora.nf4()) {
    o.push_back("lora.nf4_block=" + std::to_string(f.lora.nf4_block));
    o.push_back(std::string("lora.nf4_double_quant=") + (f.lora.nf4_double_quant ? "true" : "false"));
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
  if (j.contains("finetune")) {
    // LoRA and what trains, each within its deck key's bounds.
    const nlohmann::json& f = j["finetune"];
    auto bad = [&](const std::string& key) { return UserError(what + ": model_spec finetune." + key + " is not valid"); };
    if (!f.is_object()) throw bad("(object)");
    auto list = [&](const char* key, std::vector<std::string>& out) {
      if (!f.contains(key)) return;
      if (!f[key].is_array() || f[key].size() > 4096) throw bad(key);
      for (const auto& e : f[key]) {
        if (!e.is_string() || e.get<std::string>().size() > 4096) throw bad(key);
        out.push_back(e.get<std::string>());
      }
    };
    model::Finetune& ft = s.finetune;
    if (f.contains("lora_rank")) {
      const deck::KeySpec* k = deck::find_key("lora.rank");
      if (!f["lora_rank"].is_number_integer() || f["lora_rank"].get<int64_t>() < 0 ||
          (k && f["lora_rank"].get<int64_t>() > k->max))
        throw bad("lora_rank");
      ft.lora.rank = f["lora_rank"].get<int64_t>();
    }
    for (auto [key, field] : {std::pair<const char*, double*>{"lora_alpha", &ft.lora.alpha}, {"lora_dropout", &ft.lora.dropout}}) {
      if (!f.contains(key)) continue;
      if (!f[key].is_number()) throw bad(key);
      *field = f[key].get<double>();
    }
    if (!(ft.lora.alpha > 0) || !(ft.lora.dropout >= 0 && ft.lora.dropout < 1)) throw bad("lora_alpha / lora_dropout");
    if (f.contains("lora_rslora")) {
      if (!f["lora_rslora"].is_boolean()) throw bad("lora_rslora");
      ft.lora.rslora = f["lora_rslora"].get<bool>();
    }
    if (f.contains("lora_nf4_block")) {
      const nlohmann::json& b = f["lora_nf4_block"];
      if (!b.is_number_integer() || !model::valid_nf4_block(b.get<int64_t>())) throw bad("lora_nf4_block");
      ft.lora.nf4_block = b.get<int64_t>();
    }
    if (f.contains("lora_nf4_double_quant")) {
      if (!f["lora_nf4_double_quant"].is_boolean()) throw bad("lora_nf4_double_quant");
      ft.lora.nf4_double_quant = f["lora_nf4_double_quant"].get<bool>();
    }
    list("lora_targets", ft.lora.targets);
    list("freeze", ft.freeze);
    list("train_also", ft.train_also);
  }
  try {
    model::input_kind(s);  // an architecture the model layer knows
    return model::resolve_spec(s);  // its sizes fit together and within the limits (model_sizes.h)
  } catch (const UserError& e) {
    throw UserError(what + ": model_spec: " + e.what());
  }
}

}  // namespace shardtrain::model_io
