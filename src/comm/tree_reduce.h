// Sums in one fixed binary tree over a group's ranks, over MPI point-to-point: the bits of the
// result depend only on the inputs and the group size, never on timing or on the algorithm an
// MPI library picks (the reductions behind train.reproducible; docs/reproducibility.md).
#pragma once
#include <c10/core/ScalarType.h>
#include <mpi.h>

#include <cstdint>

#include "ring_reduce_scatter.h"  // Scratch

namespace shardtrain::comm::detail {

// The tree: ranks 2i and 2i+1 are summed first, then pairs of pairs, and so on: the element
// rank r ends with for chunk c is (((in_0 + in_1) + (in_2 + in_3)) + ...)[c]. IEEE addition is
// commutative, so which partner adds does not matter; association is what the tree fixes.
// size must be a power of two (the callers refuse others at start-up). Half types accumulate
// in fp32 and round once at the end, like the ring.

// Reduce-scatter by recursive halving with growing distance: step k pairs r with r ^ 2^k;
// each sends the chunks of its current set whose bit k differs from its own and adds what it
// receives to the others, so after log2(size) steps rank r holds chunk r. `in` holds
// size*count elements and is not written; `out` (count elements) must not overlap it.
void tree_reduce_scatter(MPI_Comm comm, int rank, int size, const void* in, void* out, int64_t count,
                         at::ScalarType dtype, Scratch& scratch);

// All-reduce in the same tree, in place: the tree reduce-scatter followed by an all-gather
// when count divides evenly and is large, else recursive doubling (both partners add the whole
// vector). Both give the same bits.
void tree_all_reduce(MPI_Comm comm, int rank, int size, void* data, int64_t count, at::ScalarType dtype,
                     Scratch& scratch);

bool is_power_of_two(int n);

}  // namespace shardtrain::comm::detail
