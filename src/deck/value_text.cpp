// Text forms of deck values: TOML literals, quoted message text and allowed-value phrases.
#include <charconv>
#include <cstdio>

#include "deck_detail.h"

namespace shardtrain::deck::detail {
namespace {

std::string number_text(double x, Type type) {
  if (type == Type::Int) return std::to_string(static_cast<int64_t>(x));
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x);  // shortest text that reads back exactly
  return std::string(buf, r.ptr);
}

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04X", c);
          out += esc;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace

const char* type_phrase(Type t) {
  switch (t) {
    case Type::Int: return "an integer";
    case Type::Float: return "a float";
    case Type::Bool: return "a boolean (true or false)";
    case Type::String: return "a string";
    case Type::StringList: return "a list of strings";
  }
  return "?";
}

std::string toml_literal(const Value& v) {
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (auto* s = std::get_if<std::string>(&v)) return toml_string(*s);
  if (auto* d = std::get_if<double>(&v)) {
    std::string t = number_text(*d, Type::Float);
    // TOML needs a '.' or an exponent to read the number back as a float.
    if (t.find_first_of(".eEn") == std::string::npos) t += ".0";
    return t;
  }
  const auto& list = std::get<std::vector<std::string>>(v);
  std::string out = "[";
  for (size_t i = 0; i < list.size(); ++i) out += (i ? ", " : "") + toml_string(list[i]);
  return out + "]";
}

std::string quoted(std::string_view s) {
  std::string out = "'";
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02X", c);
      out += esc;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "'";
}

std::string allowed_text(const KeySpec& spec) {
  if (!spec.choices.empty()) {
    std::string out;
    for (size_t i = 0; i < spec.choices.size(); ++i)
      out += (i ? ", " : "") + (spec.choices[i].empty() ? std::string("\"\"") : spec.choices[i]);
    return out;
  }
  if (spec.has_min && spec.has_max)
    return std::string(spec.min_exclusive ? "(" : "[") + number_text(spec.min, spec.type) + ", " +
           number_text(spec.max, spec.type) + (spec.max_exclusive ? ")" : "]");
  if (spec.has_min) return (spec.min_exclusive ? "> " : ">= ") + number_text(spec.min, spec.type);
  if (spec.has_max) return (spec.max_exclusive ? "< " : "<= ") + number_text(spec.max, spec.type);
  if (spec.non_empty) return "non-empty";
  return "";
}

}  // namespace shardtrain::deck::detail
