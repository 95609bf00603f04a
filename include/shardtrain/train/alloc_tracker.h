// Counting CPU allocator: live and peak bytes of every CPU tensor allocation (c10), and a
// soft per-process limit. The measuring instrument of `shardtrain plan --measure`,
// `shardtrain maxbatch` and the trainer's `peak_tensor_bytes`.
#pragma once
#include <cstdint>

namespace shardtrain::train {

// Wraps c10's current CPU allocator with one that counts the bytes it hands out (requested
// sizes, not the allocator's rounding). Idempotent, thread-safe after the first call. Tensors
// allocated before the first call keep their old allocator and are never counted, so call it
// before building anything large. Kokkos views and std::vectors (the optimizer moments) are
// not tensor memory and are not counted either: add ShardedOptimizer::state_bytes().
void install_alloc_tracker();
bool alloc_tracker_installed();

struct AllocCounters {
  int64_t live_bytes = 0;   // allocated now
  int64_t peak_bytes = 0;   // highest live_bytes since the last reset_alloc_peak()
  int64_t allocations = 0;  // allocations since install
};
AllocCounters alloc_counters();
// peak := live (start of a measured interval).
void reset_alloc_peak();

// Soft limit: an allocation that takes live bytes above `bytes` still succeeds (so no rank
// abandons a collective half-way) but sets a flag that alloc_limit_exceeded() reports until
// the next set_alloc_limit(). 0 = no limit.
void set_alloc_limit(int64_t bytes);
bool alloc_limit_exceeded();

}  // namespace shardtrain::train
