// ExactSquareSum: the sum of squares of fp32 values, exact, as a fixed-point integer; its
// merge is integer addition, so the total does not depend on how the values were split over
// ranks or in which order they were added (the gradient norm under train.reproducible).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

namespace shardtrain::fsdp {

class ExactSquareSum {
 public:
  // x*x of an fp32 x is m^2 2^(2e) with m < 2^24: at most 48 significant bits, placed exactly.
  void add(const float* x, int64_t n);
  // The accumulator as non-negative integers (each < 2^32) whose elementwise sum over ranks,
  // read back by from_words, is the sum of the accumulators (integer addition: any order, the
  // same bits): for a Comm's int64 all-reduce.
  std::vector<int64_t> words() const;
  static ExactSquareSum from_words(const int64_t* w, int64_t n);
  void merge(const ExactSquareSum& o);
  // The sum rounded to double the same way on every rank; +inf or NaN when an input was.
  double value() const;

 private:
  void normalize();
  // 32-bit digits in 64-bit limbs: the value is sum_i limb[i] 2^(32 i - 298); 2^-298 is the
  // square of fp32's smallest subnormal. 20 limbs reach 2^342, past (2^128)^2 x 2^86 values.
  static constexpr int kLimbs = 20;
  std::array<uint64_t, kLimbs> limb_{};
  int64_t adds_since_normalize_ = 0;
  bool inf_ = false, nan_ = false;
};

}  // namespace shardtrain::fsdp
