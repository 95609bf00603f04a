// The deck reference in Markdown (docs/deck-reference.md is this function's output).
#include <cctype>
#include <sstream>

#include "deck_detail.h"

namespace shardtrain::deck {
namespace {

// A '|' would end the cell and "<name>" would vanish as an HTML tag.
std::string cell(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : c == '<' ? std::string("&lt;") : std::string(1, c);
  return out;
}

std::string sentence(std::string s) {
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s + ".";
}

std::string code(const std::string& s) { return s.empty() ? "" : "`" + cell(s) + "`"; }

}  // namespace

std::string reference_markdown() {
  std::ostringstream os;
  os << "# Deck reference\n\n"
     << "<!-- Generated from src/deck/schema.cpp by `shardtrain deck reference -o docs/deck-reference.md`."
        " Do not edit by hand. -->\n\n"
     << "Every key an input deck may set, by section. A deck sets keys as `key = value` under a\n"
     << "`[section]` header; keys it leaves out take the default shown here. Any key can also be set\n"
     << "on the command line with `--set section.key=value`. See [decks.md](decks.md) for how decks\n"
     << "are read, checked and recorded.\n";
  for (const auto& section : sections()) {
    os << "\n## [" << section.name << "]\n\n" << sentence(section.help) << "\n\n"
       << "| key | type | default | allowed | unit | description |\n"
       << "|---|---|---|---|---|---|\n";
    for (const auto& spec : schema()) {
      if (spec.key.compare(0, section.name.size() + 1, section.name + ".") != 0) continue;
      std::string name = spec.key.substr(section.name.size() + 1);
      os << "| " << code(name) << " | " << to_string(spec.type) << " | "
         << code(detail::toml_literal(spec.default_value)) << " | " << cell(detail::allowed_text(spec)) << " | "
         << cell(spec.unit) << " | " << cell(spec.help) << " |\n";
    }
  }
  return os.str();
}

}  // namespace shardtrain::deck
