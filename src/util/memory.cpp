// Reads VmRSS/VmHWM; the kernel keeps the peak for us.
#include "shardtrain/util/memory.h"

#include <cstdio>
#include <cstring>

namespace shardtrain {
ProcessMemory read_process_memory() {
  ProcessMemory m;
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return m;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    long long kb = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &kb) == 1) m.rss_bytes = kb * 1024;
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) m.hwm_bytes = kb * 1024;
  }
  std::fclose(f);
  return m;
}
bool reset_peak_rss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  bool ok = std::fputs("5", f) >= 0;
  std::fclose(f);
  return ok;
}
}  // namespace shardtrain
