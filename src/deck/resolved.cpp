// The resolved deck as TOML: every key in schema order, each with its help as a trailing comment.
#include <algorithm>
#include <sstream>

#include "deck_detail.h"

namespace shardtrain::deck {

std::string Deck::resolved_toml() const {
  std::ostringstream os;
  os << "# shardtrain resolved deck: every key, defaults included; \"(default)\" marks keys not set.\n";
  for (const auto& section : sections()) {
    std::vector<std::pair<std::string, const KeySpec*>> lines;
    for (const auto& spec : schema()) {
      if (spec.key.compare(0, section.name.size() + 1, section.name + ".") != 0) continue;
      lines.emplace_back(spec.key.substr(section.name.size() + 1) + " = " + detail::toml_literal(values_.at(spec.key)),
                         &spec);
    }
    // Line the comments up, but let a long list push its own comment right instead of all of them.
    size_t column = 0;
    for (auto& [text, spec] : lines) column = std::max(column, std::min<size_t>(text.size(), 40));
    os << "\n[" << section.name << "]  # " << section.help << "\n";
    for (auto& [text, spec] : lines) {
      os << text << std::string(column > text.size() ? column - text.size() : 0, ' ') << "  # " << spec->help;
      if (!spec->unit.empty()) os << " [" << spec->unit << "]";
      if (!is_set(spec->key)) os << " (default)";
      os << "\n";
    }
  }
  return os.str();
}

}  // namespace shardtrain::deck
