// Memory readings: this process's (/proc/self/status: resident and peak resident bytes) and this
// host's (/proc/meminfo and the cgroup limit).
#pragma once
#include <cstdint>

namespace shardtrain {
struct ProcessMemory {
  int64_t rss_bytes = 0;   // VmRSS
  int64_t hwm_bytes = 0;   // VmHWM: peak resident set since start (or last reset)
};
ProcessMemory read_process_memory();
// Resets VmHWM to the current RSS (writes "5" to /proc/self/clear_refs); false if not allowed.
bool reset_peak_rss();

struct HostMemory {
  double total_bytes = 0;       // MemTotal, or the cgroup's limit when that is lower (0: unknown)
  int64_t available_bytes = 0;  // MemAvailable (0: unknown)
};
HostMemory read_host_memory();
}  // namespace shardtrain
