// Parameter-name patterns: the one rule every layer uses (wrap policy, ignored and fp32-kept
// parameters, weight-decay exclusions, a model's own norms, frozen and extra trainable
// parameters of a fine-tune).
#pragma once
#include <fnmatch.h>

#include <string>
#include <vector>

namespace shardtrain {

// Whether a pattern is a glob: it holds *, ? or [ (fnmatch's special characters).
inline bool is_glob(const std::string& pattern) { return pattern.find_first_of("*?[") != std::string::npos; }

// Whether `name` matches one of `patterns` (empty patterns match nothing). A glob matches the
// whole name as fnmatch(3) without flags does ('*' crosses dots: "model.layers.1*" is layers 1,
// 10-19, 100-...; "model.layers.[0-9].*" is layers 0-9); any other pattern matches where it
// occurs in the name ("norm" is every norm).
inline bool matches_any(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns) {
    if (p.empty()) continue;
    if (is_glob(p) ? fnmatch(p.c_str(), name.c_str(), 0) == 0 : name.find(p) != std::string::npos) return true;
  }
  return false;
}

}  // namespace shardtrain
