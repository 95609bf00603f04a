// Reads VmRSS/VmHWM (the kernel keeps the peak for us) and the host's memory.
#include "shardtrain/util/memory.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

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

HostMemory read_host_memory() {
  HostMemory h;
  std::ifstream f("/proc/meminfo");
  for (std::string line; std::getline(f, line);) {
    long long kb = 0;
    if (std::sscanf(line.c_str(), "MemTotal: %lld kB", &kb) == 1) h.total_bytes = 1024.0 * static_cast<double>(kb);
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kb) == 1) h.available_bytes = kb * 1024;
  }
  for (const char* cg : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream c(cg);
    double limit = 0;
    if (c >> limit && limit > 0 && (h.total_bytes <= 0 || limit < h.total_bytes)) h.total_bytes = limit;
  }
  return h;
}
}  // namespace shardtrain
