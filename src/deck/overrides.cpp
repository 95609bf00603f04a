// Command-line overrides "section.key=value", typed by the schema and applied after the file.
#include <charconv>

#include "deck_detail.h"
#include "shardtrain/util/error.h"

namespace shardtrain::deck {
namespace {

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

// Shells make quoting awkward, so quotes are optional: --set run.name=a and --set 'run.name="a"'.
std::string unquote(const std::string& s) {
  if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front())
    return s.substr(1, s.size() - 2);
  return s;
}

// Parses `text` as the key's type; on failure returns false and says why in `why`.
bool parse_typed(const KeySpec& spec, const std::string& text, Value& out, std::string& why) {
  const std::string got = ", got " + detail::quoted(text);
  switch (spec.type) {
    case Type::Int: {
      const char* b = text.data() + (text.size() > 1 && text[0] == '+' ? 1 : 0);
      const char* e = text.data() + text.size();
      int64_t v = 0;
      auto r = std::from_chars(b, e, v);
      if (r.ec == std::errc::result_out_of_range && r.ptr == e) {
        why = "does not fit a 64-bit integer" + got;
        return false;
      }
      if (r.ec != std::errc() || r.ptr != e || b == e) {
        why = "expected an integer" + got;
        return false;
      }
      out = v;
      return true;
    }
    case Type::Float: {
      const char* b = text.data() + (text.size() > 1 && text[0] == '+' ? 1 : 0);
      const char* e = text.data() + text.size();
      double v = 0;
      auto r = std::from_chars(b, e, v);
      if (r.ec == std::errc::result_out_of_range && r.ptr == e) {
        why = "does not fit a double" + got;
        return false;
      }
      if (r.ec != std::errc() || r.ptr != e || b == e) {
        why = "expected a float" + got;
        return false;
      }
      out = v;
      return true;
    }
    case Type::Bool:
      if (text == "true" || text == "false") {
        out = text == "true";
        return true;
      }
      why = "expected true or false" + got;
      return false;
    case Type::String:
      out = unquote(text);
      return true;
    case Type::StringList: {
      std::string body = text;
      if (!body.empty() && body.front() == '[') {
        if (body.back() != ']') {
          why = "expected a list like [a,b] or a,b" + got;
          return false;
        }
        body = trim(body.substr(1, body.size() - 2));
      }
      std::vector<std::string> items;
      size_t start = 0;
      while (!body.empty() && start <= body.size()) {
        size_t comma = body.find(',', start);
        if (comma == std::string::npos) comma = body.size();
        std::string item = unquote(trim(std::string_view(body).substr(start, comma - start)));
        if (item.empty()) {
          why = "empty element in the list" + got;
          return false;
        }
        items.push_back(item);
        start = comma + 1;
      }
      out = items;
      return true;
    }
  }
  return false;
}

}  // namespace

void Deck::apply_override(const std::string& assignment) {
  const std::string shown = detail::quoted(assignment);
  const std::string where = "--set " + shown.substr(1, shown.size() - 2);
  auto eq = assignment.find('=');
  if (eq == std::string::npos)
    throw UserError(where + ": expected KEY=VALUE, e.g. --set optimizer.lr=3e-4");
  std::string key = trim(std::string_view(assignment).substr(0, eq));
  std::string text = trim(std::string_view(assignment).substr(eq + 1));
  const KeySpec* spec = find_key(key);
  if (!spec) {
    if (detail::is_section(key))
      throw UserError(where + ": " + detail::quoted(key) + " is a section; name a key, e.g. " + key +
                      ".<key>=..." + detail::key_suggestion(key));
    throw UserError(where + ": unknown key " + detail::quoted(key) + detail::key_suggestion(key));
  }
  Value v;
  std::string why;
  if (!parse_typed(*spec, text, v, why)) throw UserError(where + ": " + why);
  std::string problem = detail::check_value(*spec, v);
  if (!problem.empty()) throw UserError(where + ": " + problem);
  set_value(key, std::move(v), where);
}

}  // namespace shardtrain::deck
