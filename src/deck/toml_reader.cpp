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

namespace shardtrain::deck {
namespace {

// Decks are a few kilobytes; anything this big is the wrong file (a checkpoint, a dataset).
constexpr std::uintmax_t kMaxDeckBytes = 16u << 20;

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

std::vector<Assignment> read_toml(const std::string& text, const std::string& file) {
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
  namespace fs = std::filesystem;
  if (path.empty()) throw UserError("no deck file given (the path is empty)");
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) throw UserError(path + ": deck file not found");
  if (fs::is_directory(st)) throw UserError(path + ": is a directory, not a deck file");
  if (fs::is_regular_file(st)) {
    auto size = fs::file_size(path, ec);
    if (!ec && size > kMaxDeckBytes)
      throw UserError(path + ": " + std::to_string(size) +
                      " bytes is far too big for a deck (a TOML text file); is this the right file?");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot read deck file: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw UserError(path + ": cannot read deck file: " + std::strerror(errno));
  return parse(text.str(), path, overrides);
}

}  // namespace shardtrain::deck
