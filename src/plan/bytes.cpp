// Byte sizes: "80GiB", "1.5e9", ... parsed; "1.23 GiB" printed.
#include "shardtrain/plan/bytes.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <exception>

#include "shardtrain/util/error.h"

namespace shardtrain::plan {

std::string format_bytes(int64_t bytes) {
  char buf[64];
  const double v = static_cast<double>(bytes);
  const double a = std::fabs(v);
  if (a >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", v / (1024.0 * 1024 * 1024));
  else if (a >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", v / (1024.0 * 1024));
  else if (a >= 1024.0) std::snprintf(buf, sizeof buf, "%.1f KiB", v / 1024.0);
  else std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  return buf;
}

int64_t parse_bytes(const std::string& text, const std::string& what) {
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
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb") mult = 1e3;
  else if (unit == "m" || unit == "mb") mult = 1e6;
  else if (unit == "g" || unit == "gb") mult = 1e9;
  else if (unit == "t" || unit == "tb") mult = 1e12;
  else if (unit == "kib") mult = 1024.0;
  else if (unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else throw UserError(what + ": unknown unit '" + text.substr(pos) + "' in '" + text + "' (B, KB, MB, GB, KiB, MiB, GiB)");
  ST_USER_CHECK(v > 0 && std::isfinite(v), what, ": '", text, "' must be a positive size");
  ST_USER_CHECK(v * mult < 9.0e18, what, ": '", text, "' is too large (at most 8 EiB)");
  return static_cast<int64_t>(v * mult);
}

}  // namespace shardtrain::plan
