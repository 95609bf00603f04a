// "Did you mean ...?": the valid key or section nearest to a misspelt or misplaced one.
#include <algorithm>
#include <vector>

#include "deck_detail.h"

namespace shardtrain::deck::detail {
namespace {

// Edit distance where swapping two neighbours counts once ("rl" -> "lr"), the usual typo.
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

// Close enough to be a typo rather than a different word.
bool plausible(size_t distance, size_t length) { return distance <= std::max<size_t>(1, length / 3); }

std::pair<std::string, std::string> split_key(const std::string& key) {
  auto dot = key.rfind('.');
  if (dot == std::string::npos) return {"", key};
  return {key.substr(0, dot), key.substr(dot + 1)};
}

}  // namespace

bool is_section(const std::string& name) {
  const auto& s = sections();
  return std::any_of(s.begin(), s.end(), [&](const SectionSpec& x) { return x.name == name; });
}

std::string key_suggestion(const std::string& key) {
  auto [section, name] = split_key(key);
  const KeySpec* best = nullptr;
  size_t best_score = 0;
  for (const auto& spec : schema()) {
    auto [spec_section, spec_name] = split_key(spec.key);
    // A right name in the wrong section is one edit away: moving it is the fix.
    size_t score = std::min(edit_distance(key, spec.key),
                            edit_distance(name, spec_name) + (section == spec_section ? 0 : 1));
    // "warmup" for "warmup_steps": a prefix of a key name is a likely abbreviation.
    if (name.size() >= 4 && spec_name.compare(0, name.size(), name) == 0)
      score = std::min<size_t>(score, section == spec_section ? 1 : 2);
    if (!best || score < best_score) best = &spec, best_score = score;
  }
  if (!best || !plausible(best_score, name.size())) return "";
  return " (did you mean '" + best->key + "'?)";
}

std::string section_suggestion(const std::string& name) {
  const SectionSpec* best = nullptr;
  size_t best_score = 0;
  for (const auto& s : sections()) {
    size_t score = edit_distance(name, s.name);
    if (!best || score < best_score) best = &s, best_score = score;
  }
  if (!best || !plausible(best_score, name.size())) return "";
  return " (did you mean [" + best->name + "]?)";
}

}  // namespace shardtrain::deck::detail
