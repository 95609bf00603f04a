// Internal: the Kokkos range policy every optimizer kernel uses, and the walk over a DecayMask's
// decayed ranges and the gaps between them.
#pragma once
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "shardtrain/optim/decay_mask.h"
#include "shardtrain/util/error.h"

namespace shardtrain::optim::detail {

// A long index (not Kokkos' default int) lets GCC prove the loop counter cannot wrap, which it
// needs to vectorise; together with -fno-math-errno (sqrt) that was a 5x difference measured on
// the AdamW kernel. It also keeps shards above 2^31 elements correct.
using FlatPolicy = Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<long>>;

inline FlatPolicy flat_policy(int64_t begin, int64_t end) {
  return FlatPolicy(static_cast<long>(begin), static_cast<long>(end));
}

inline void require_kokkos(const char* kernel) {
  ST_CHECK(Kokkos::is_initialized(), kernel,
           " needs Kokkos to be running: main() must hold an optim::KokkosScope");
}

// Calls segment(begin, end, decayed) for consecutive segments covering [0, n), alternating
// between the mask's ranges (decayed = true) and the gaps between them (decayed = false).
template <class Segment>
void for_each_segment(const DecayMask& mask, int64_t n, Segment&& segment) {
  ST_CHECK(mask.extent() <= n, "decay mask reaches element ", mask.extent(),
           " but the shard has only ", n);
  int64_t pos = 0;
  for (const ElementRange& r : mask.ranges()) {
    if (r.begin > pos) segment(pos, r.begin, false);
    segment(r.begin, r.end, true);
    pos = r.end;
  }
  if (pos < n) segment(pos, n, false);
}

}  // namespace shardtrain::optim::detail
