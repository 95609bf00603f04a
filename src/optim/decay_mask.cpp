// DecayMask: normalisation (drop empty, merge touching, reject overlap) and restriction to a shard.
#include "shardtrain/optim/decay_mask.h"

#include <algorithm>

#include "shardtrain/util/error.h"

namespace shardtrain::optim {

DecayMask::DecayMask(std::vector<ElementRange> ranges) {
  ranges_.reserve(ranges.size());
  for (const ElementRange& r : ranges) {
    ST_CHECK(r.begin >= 0 && r.end >= r.begin, "bad decay range [", r.begin, ", ", r.end, ")");
    if (r.size() == 0) continue;
    if (!ranges_.empty()) {
      ElementRange& last = ranges_.back();
      ST_CHECK(r.begin >= last.end, "decay ranges must be sorted and disjoint: [", last.begin,
               ", ", last.end, ") then [", r.begin, ", ", r.end, ")");
      if (r.begin == last.end) {
        last.end = r.end;
        continue;
      }
    }
    ranges_.push_back(r);
  }
}

DecayMask DecayMask::restrict_to(int64_t begin, int64_t end) const {
  ST_CHECK(0 <= begin && begin <= end, "bad shard [", begin, ", ", end, ")");
  std::vector<ElementRange> out;
  for (const ElementRange& r : ranges_) {
    const int64_t b = std::max(r.begin, begin);
    const int64_t e = std::min(r.end, end);
    if (b < e) out.push_back({b - begin, e - begin});
  }
  return DecayMask(std::move(out));
}

int64_t DecayMask::decayed_elements() const {
  int64_t total = 0;
  for (const ElementRange& r : ranges_) total += r.size();
  return total;
}

}  // namespace shardtrain::optim
