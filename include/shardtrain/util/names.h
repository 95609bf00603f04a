// Parameter-name patterns: the one substring rule every layer uses (wrap policy, ignored and
// fp32-kept parameters, weight-decay exclusions, a model's own norms).
#pragma once
#include <string>
#include <vector>

namespace shardtrain {

// Whether `name` contains one of `patterns` (empty patterns match nothing).
inline bool matches_any(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns)
    if (!p.empty() && name.find(p) != std::string::npos) return true;
  return false;
}

}  // namespace shardtrain
