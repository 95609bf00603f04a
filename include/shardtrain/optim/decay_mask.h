// DecayMask: which elements of a flat shard receive weight decay, as sorted [begin, end) ranges.
#pragma once
#include <cstdint>
#include <vector>

namespace shardtrain::optim {

struct ElementRange {
  int64_t begin = 0;
  int64_t end = 0;  // exclusive
  int64_t size() const { return end - begin; }
  bool operator==(const ElementRange& o) const { return begin == o.begin && end == o.end; }
};

// The FSDP engine derives the ranges from parameter names (biases and norms get no decay) over
// the unit's flat layout, then restricts them to the rank's shard. Ranges are kept sorted,
// disjoint and merged, so the kernels walk them as a few long segments, each one fused loop
// with decay either on or off: no per-element lookup.
class DecayMask {
 public:
  DecayMask() = default;  // no element decays
  // Empty ranges are dropped and touching ones merged; unsorted or overlapping ranges are a bug
  // in the caller and throw.
  explicit DecayMask(std::vector<ElementRange> ranges);

  static DecayMask none() { return DecayMask(); }
  static DecayMask all(int64_t n) { return DecayMask({{0, n}}); }

  // The mask of the sub-array [begin, end), with indices relative to begin: turns a mask over a
  // unit's whole flat parameter into the mask of one rank's shard.
  DecayMask restrict_to(int64_t begin, int64_t end) const;

  const std::vector<ElementRange>& ranges() const { return ranges_; }
  int64_t decayed_elements() const;
  // One past the last decayed element (0 when none): the smallest shard length this mask fits.
  int64_t extent() const { return ranges_.empty() ? 0 : ranges_.back().end; }
  bool operator==(const DecayMask& o) const { return ranges_ == o.ranges_; }

 private:
  std::vector<ElementRange> ranges_;
};

}  // namespace shardtrain::optim
