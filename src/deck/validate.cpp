// Checks one value against its key's range, choices and emptiness rule.
#include <algorithm>
#include <cmath>

#include "deck_detail.h"
#include "shardtrain/util/path_inside.h"

namespace shardtrain::deck::detail {

std::string check_value(const KeySpec& spec, const Value& v) {
  if (spec.type == Type::Int || spec.type == Type::Float) {
    double x = spec.type == Type::Int ? static_cast<double>(std::get<int64_t>(v)) : std::get<double>(v);
    if (!std::isfinite(x)) return "must be a finite number, got " + toml_literal(v);
    bool low = spec.has_min && (spec.min_exclusive ? !(x > spec.min) : !(x >= spec.min));
    bool high = spec.has_max && (spec.max_exclusive ? !(x < spec.max) : !(x <= spec.max));
    if (low || high) {
      std::string range = allowed_text(spec);
      if (!(spec.has_min && spec.has_max)) return "must be " + range + ", got " + toml_literal(v);
      // An interval: name the bound that was crossed, then the whole range.
      KeySpec one = spec;
      (low ? one.has_max : one.has_min) = false;
      return "must be " + allowed_text(one) + " (allowed: " + range + "), got " + toml_literal(v);
    }
  }
  if (spec.type == Type::String) {
    const auto& s = std::get<std::string>(v);
    // A NUL would cut the value short wherever it becomes a C string (a path, a name).
    if (s.find('\0') != std::string::npos) return "must not contain a NUL character";
    if (spec.non_empty && s.empty()) return "must not be empty";
    if (!spec.inside.empty() && !s.empty()) {
      const std::string why = path_escape_reason(s);
      if (!why.empty()) return "must be a relative path that stays inside " + spec.inside + "; " + why + " (got " + quoted(s) + ")";
    }
    if (!spec.choices.empty() &&
        std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end())
      return "must be one of: " + allowed_text(spec) + "; got " + quoted(s);
  }
  if (spec.type == Type::StringList)
    for (const std::string& s : std::get<std::vector<std::string>>(v))
      if (s.find('\0') != std::string::npos) return "must not contain a NUL character (in " + quoted(s) + ")";
  return "";
}

}  // namespace shardtrain::deck::detail
