// parse_byte_size (see byte_size.h).
#include "shardtrain/util/byte_size.h"

#include <cctype>
#include <cmath>
#include <exception>
#include <utility>

#include "shardtrain/util/error.h"

namespace shardtrain {

int64_t parse_byte_size(const std::string& text, const std::string& what) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw UserError(what + ": '" + text + "' is not a size (examples: 80GiB, 512MiB, 2GB, 1.5e9)");
  }
  std::string unit = text.substr(pos);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  constexpr double kKi = 1024.0;
  const std::pair<const char*, double> units[] = {
      {"", 1},          {"b", 1},
      {"kb", 1e3},      {"mb", 1e6},            {"gb", 1e9},                  {"tb", 1e12},
      {"kib", kKi},     {"mib", kKi * kKi},     {"gib", kKi * kKi * kKi},     {"tib", kKi * kKi * kKi * kKi},
      {"k", kKi},       {"m", kKi * kKi},       {"g", kKi * kKi * kKi},       {"t", kKi * kKi * kKi * kKi},
  };
  double mult = 0;
  for (const auto& [u, m] : units)
    if (unit == u) mult = m;
  if (mult == 0)
    throw UserError(what + ": unknown unit '" + text.substr(pos) + "' in '" + text + "' (B, KB, MB, GB, KiB, MiB, GiB)");
  ST_USER_CHECK(v > 0 && std::isfinite(v) && v * mult >= 1, what, ": '", text, "' must be a positive size");
  ST_USER_CHECK(v * mult < 9.0e18, what, ": '", text, "' is too large (at most 8 EiB)");
  return static_cast<int64_t>(v * mult);
}

}  // namespace shardtrain
