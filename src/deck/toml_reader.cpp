// Reading a deck file: toml++ parses it, then every section and key is checked against the schema.
#include <toml++/toml.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "deck_detail.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::deck {
namespace {

// Decks are a few kilobytes; anything this big is the wrong file (a checkpoint, a dataset).
constexpr std::uint64_t kMaxDeckBytes = kMaxDeckFileBytes;

struct Assignment {
  std::string key;
  Value value;
  std::string origin;
};

// toml++ descriptions may quote the offending bytes; keep the message on one line.
std::string one_line(std::string_view s) {
  std::string q = detail::quoted(s);
  return q.substr(1, q.size() - 2);
}

std::string where(const std::string& file, const toml::source_position& pos) {
  std::ostringstream os;
  os << file << ":" << pos.line << ":" << pos.column;
  return os.str();
}

[[noreturn]] void fail(const std::string& loc, const std::string& msg) { throw UserError(loc + ": " + msg); }

std::string node_phrase(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string (" + detail::quoted(*n.value<std::string>()) + ")";
    case toml::node_type::integer: return "an integer (" + std::to_string(*n.value<int64_t>()) + ")";
    case toml::node_type::floating_point: return "a float (" + detail::toml_literal(*n.value<double>()) + ")";
    case toml::node_type::boolean: return std::string("a boolean (") + (*n.value<bool>() ? "true" : "false") + ")";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

[[noreturn]] void fail_type(const toml::node& n, const KeySpec& spec, const std::string& file,
                            const std::string& hint = "") {
  fail(where(file, n.source().begin),
       spec.key + ": expected " + detail::type_phrase(spec.type) + ", got " + node_phrase(n) + hint);
}

Value convert(const toml::node& n, const KeySpec& spec, const std::string& file) {
  switch (spec.type) {
    case Type::Int: {
      if (auto i = n.value_exact<int64_t>()) return *i;
      auto d = n.value_exact<double>();
      if (d && std::isfinite(*d) && std::trunc(*d) == *d && std::fabs(*d) < 9.0e18)
        fail_type(n, spec, file, " (write " + std::to_string(static_cast<int64_t>(*d)) + ")");
      fail_type(n, spec, file);
    }
    case Type::Float:
      if (n.is_floating_point()) return *n.value_exact<double>();
      if (n.is_integer()) return static_cast<double>(*n.value_exact<int64_t>());
      fail_type(n, spec, file);
    case Type::Bool:
      if (auto b = n.value_exact<bool>()) return *b;
      fail_type(n, spec, file);
    case Type::String:
      if (auto s = n.value_exact<std::string>()) return *s;
      fail_type(n, spec, file);
    case Type::StringList: {
      const toml::array* arr = n.as_array();
      if (!arr) fail_type(n, spec, file, n.is_string() ? " (write [" + detail::toml_literal(*n.value<std::string>()) + "])" : "");
      std::vector<std::string> items;
      for (size_t i = 0; i < arr->size(); ++i) {
        const toml::node& item = *arr->get(i);
        auto s = item.value_exact<std::string>();
        if (!s)
          fail(where(file, item.source().begin), spec.key + ": expected a list of strings, element " +
                                                     std::to_string(i + 1) + " is " + node_phrase(item));
        items.push_back(*s);
      }
      return items;
    }
  }
  fail_type(n, spec, file);
}

void read_section(const std::string& section, const toml::table& table, const std::string& file,
                  std::vector<Assignment>& out) {
  for (auto&& [k, node] : table) {
    std::string key = section + "." + std::string(k.str());
    std::string loc = where(file, k.source().begin);
    const KeySpec* spec = find_key(key);
    if (!spec) {
      if (node.is_table() || node.is_array_of_tables())
        fail(loc, "nested table " + detail::quoted(key) +
                      " is not allowed: deck keys are [section] key = value");
      fail(loc, "unknown key " + detail::quoted(key) + detail::key_suggestion(key));
    }
    Value v = convert(node, *spec, file);
    std::string problem = detail::check_value(*spec, v);
    if (!problem.empty()) fail(where(file, node.source().begin), key + ": " + problem);
    out.push_back({key, std::move(v), loc});
  }
}

// A deck is at most [section] key = value with a list or inline table as the value (depth 3).
// toml++ recurses once per level of dotted headers, dotted keys, arrays and inline tables, so
// a crafted file thousands of levels deep overflows the stack: this scan (a loop, no
// recursion) refuses anything deeper than kMaxDeckNesting before toml++ sees the text.
// Strings and comments are skipped, so dots and brackets inside them do not count.
void check_nesting(std::string_view t, const std::string& file) {
  struct Frame {
    char type;  // '[' array, '{' inline table
    int depth;  // the container's own depth
  };
  std::vector<Frame> stack;
  size_t line = 1, line_start = 0;
  int table_depth = 0;       // of the last [header]
  int container_depth = 0;   // depth of the table the current key belongs to
  int key_segs = 1;          // segments of the current (dotted) key
  int val_depth = 0;         // depth of the value being read
  bool key_pos = true;       // reading a key (or a header), not a value
  bool line_blank = true;    // nothing but whitespace so far on this line
  auto fail_at = [&](size_t i, int depth) {
    throw UserError(file + ":" + std::to_string(line) + ":" + std::to_string(i - line_start + 1) +
                    ": nesting " + std::to_string(depth) + " levels deep (tables, dotted keys, arrays or inline "
                    "tables); a deck allows at most " + std::to_string(kMaxDeckNesting) +
                    " levels ([section], key = value)");
  };
  auto newline = [&](size_t i) {
    ++line;
    line_start = i + 1;
  };
  // Skips a string starting at t[i] (a quote); returns the index of its last character.
  auto skip_string = [&](size_t i) -> size_t {
    const char q = t[i];
    const bool triple = t.compare(i, 3, std::string(3, q)) == 0;
    size_t j = i + (triple ? 3 : 1);
    for (; j < t.size(); ++j) {
      char c = t[j];
      if (c == '\n') {
        if (!triple) return j - 1;  // unterminated: toml++ reports it
        newline(j);
      } else if (c == '\\' && q == '"') {
        if (j + 1 < t.size() && t[j + 1] == '\n') newline(j + 1);
        ++j;
      } else if (c == q) {
        if (!triple) return j;
        if (t.compare(j, 3, std::string(3, q)) == 0) {
          while (j + 3 < t.size() && t[j + 3] == q) ++j;  // up to two quotes may end the content
          return j + 2;
        }
      }
    }
    return t.size() - 1;
  };
  auto start_key = [&](int depth) {
    key_pos = true;
    container_depth = depth;
    key_segs = 1;
  };
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '\n') {
      newline(i);
      line_blank = true;
      if (stack.empty()) start_key(table_depth);
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r') continue;
    const bool at_line_start = line_blank;
    line_blank = false;
    if (c == '#') {
      while (i + 1 < t.size() && t[i + 1] != '\n') ++i;
      continue;
    }
    if (c == '"' || c == '\'') {
      i = skip_string(i);
      continue;
    }
    if (key_pos && stack.empty() && at_line_start && c == '[') {
      // A [header] or [[header]]: its dotted segments are its depth.
      int segs = 1;
      size_t j = i + 1;
      if (j < t.size() && t[j] == '[') {
        ++segs;
        ++j;
      }
      for (; j < t.size() && t[j] != ']' && t[j] != '\n'; ++j) {
        if (t[j] == '"' || t[j] == '\'') j = skip_string(j);
        else if (t[j] == '.' && ++segs > kMaxDeckNesting) fail_at(j, segs);
      }
      if (segs > kMaxDeckNesting) fail_at(i, segs);
      table_depth = segs;
      i = j > i ? j - 1 : i;  // the loop sees the ']' next, which closes nothing
      start_key(table_depth);
      continue;
    }
    if (key_pos) {
      if (c == '.') {
        if (container_depth + ++key_segs > kMaxDeckNesting) fail_at(i, container_depth + key_segs);
      } else if (c == '=') {
        key_pos = false;
        val_depth = container_depth + key_segs;
      } else if (c == '}' && !stack.empty() && stack.back().type == '{') {  // empty inline table
        stack.pop_back();
        key_pos = false;
        val_depth = stack.empty() ? 0 : stack.back().depth + 1;
      }
      continue;
    }
    switch (c) {
      case '[':
      case '{':
        if (val_depth + 1 > kMaxDeckNesting) fail_at(i, val_depth + 1);
        stack.push_back({c, val_depth});
        if (c == '{') start_key(val_depth);
        else val_depth += 1;
        break;
      case ']':
      case '}':
        if (!stack.empty() && stack.back().type == (c == ']' ? '[' : '{')) stack.pop_back();
        if (!stack.empty()) val_depth = stack.back().depth + 1;
        break;
      case ',':
        if (!stack.empty() && stack.back().type == '{') start_key(stack.back().depth);
        else if (!stack.empty()) val_depth = stack.back().depth + 1;
        break;
      default:
        break;
    }
  }
}

std::vector<Assignment> read_toml(const std::string& text, const std::string& file) {
  check_nesting(text, file);
  toml::table root;
  try {
    root = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    std::string what = one_line(e.description());
    // Typically a binary file or a UTF-16 file from an editor passed as the deck.
    if (what.find("utf-8") != std::string::npos) what += " (a deck must be UTF-8 TOML text)";
    fail(where(file, e.source().begin), what);
  }
  std::vector<Assignment> out;
  for (auto&& [k, node] : root) {
    std::string name(k.str());
    std::string loc = where(file, k.source().begin);
    bool section = detail::is_section(name);
    if (node.is_table()) {
      if (!section) {
        std::string hint = detail::section_suggestion(name);
        fail(loc, "unknown section [" + one_line(name) + "]" + (hint.empty() ? detail::key_suggestion(name) : hint));
      }
      read_section(name, *node.as_table(), file, out);
    } else if (section && node.is_array_of_tables()) {
      fail(loc, "[[" + name + "]] makes an array of tables; write [" + name + "]");
    } else {
      std::string hint = detail::key_suggestion(name);
      if (hint.empty() && section)
        fail(loc, detail::quoted(name) + " is a section, not a key: write [" + name + "] and its keys below it");
      fail(loc, "unknown key " + detail::quoted(name) + " outside any section" +
                    (hint.empty() ? " (every key belongs in a [section])" : hint));
    }
  }
  return out;
}

}  // namespace

Deck Deck::parse(const std::string& text, const std::string& source_name,
                 const std::vector<std::string>& overrides) {
  Deck d = from_schema();
  d.source_ = source_name;
  for (auto& a : read_toml(text, source_name)) d.set_value(a.key, std::move(a.value), a.origin);
  for (const auto& o : overrides) d.apply_override(o);
  d.check_relations();
  return d;
}

Deck Deck::load(const std::string& path, const std::vector<std::string>& overrides) {
  // Only a regular file, read up to the cap: a FIFO or /dev/zero would block or never end.
  return parse(read_small_file(path, kMaxDeckBytes, "deck"), path, overrides);
}

}  // namespace shardtrain::deck
