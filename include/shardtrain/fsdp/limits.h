// The engine's limits: what the engine keeps in flight and its scratch sizes, which the memory
// planner models. A header of its own so that the collectives (collectives.cpp) need not include
// the engine: the files depend one way, engine -> schedule -> zeropp -> collectives -> limits.
#pragma once
#include <cstddef>
#include <cstdint>

namespace shardtrain::fsdp {

// Reduce-scatters of finished units kept in flight during backward: each holds its unit's
// unsharded gradient buffer (input) and its shard (output) until retired; issuing one more first
// retires the oldest. The memory planner's bound on pending reductions.
inline constexpr size_t kMaxPendingReductions = 2;
// Device->host gradient copies kept in flight under cpu_offload.
inline constexpr size_t kMaxPendingCopies = 4;

// clip_grad_norm squares gradients in fp64 this many elements at a time (its only scratch
// memory: 8 bytes per element of one chunk).
inline constexpr int64_t kNormChunkElems = int64_t{1} << 20;

}  // namespace shardtrain::fsdp
