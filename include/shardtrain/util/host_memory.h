// keep_freed_host_memory: glibc malloc set to keep freed memory in the process for reuse.
#pragma once

namespace shardtrain {
// Why: a training step frees and allocates the same large blocks every step (FSDP's unsharded
// parameters and gradients, logits, activations). glibc serves blocks over its mmap threshold
// (at most 32 MiB) with fresh mmaps and returns them on free, so every step faults those pages
// in again and the kernel zeroes each one: a quarter of the CPU time of a 4-rank CPU step
// (perf/README.md "PyTorch DDP comparison"). With mmap off and no trimming, freed blocks stay in
// the heap and the next step reuses them; the price is that resident memory stays at the heap's
// high-water mark instead of falling between steps. Idempotent; affects later allocations only.
// Returns false if glibc refused a setting (non-glibc C library: then nothing changed).
bool keep_freed_host_memory();
}  // namespace shardtrain
