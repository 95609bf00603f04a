// keep_freed_host_memory (host_memory.h): mallopt of glibc's mmap and trim thresholds.
#include "shardtrain/util/host_memory.h"

#include <climits>  // first: it defines __GLIBC__ (features.h)

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace shardtrain {
bool keep_freed_host_memory() {
#if defined(__GLIBC__)
  // M_MMAP_MAX 0: every block comes from the heap (brk, or a thread arena, which falls back to
  // the main heap for blocks larger than its 64 MiB heaps), so free() keeps it for reuse.
  // M_TRIM_THRESHOLD: never give the heap's top back (a later step would fault it in again).
  // Setting either also stops glibc's dynamic threshold adjustment, which is what we want.
  const bool mmap_off = mallopt(M_MMAP_MAX, 0) == 1;
  const bool no_trim = mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
  return mmap_off && no_trim;
#else
  return false;
#endif
}
}  // namespace shardtrain
