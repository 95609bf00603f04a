// Process memory readings from /proc/self/status (resident and peak resident bytes).
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
}  // namespace shardtrain
