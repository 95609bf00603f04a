// ExactSquareSum (see exact_square_sum.h).
#include "shardtrain/fsdp/exact_square_sum.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "shardtrain/util/error.h"

namespace shardtrain::fsdp {

void ExactSquareSum::add(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &x[i], sizeof bits);
    const uint32_t ef = (bits >> 23) & 0xFF, frac = bits & 0x7FFFFF;
    if (ef == 0xFF) {
      (frac ? nan_ : inf_) = true;
      continue;
    }
    if (ef == 0 && frac == 0) continue;
    // x = m 2^(e), e = ef - 150 (normal) or -149 (subnormal); x^2 = m^2 2^(2e); 2e + 298 >= 0.
    const uint64_t m = ef ? (frac | 0x800000u) : frac;
    const int shift = ef ? 2 * static_cast<int>(ef) - 2 : 0;
    const unsigned __int128 v = static_cast<unsigned __int128>(m * m) << (shift & 31);
    const int q = shift >> 5;
    limb_[q] += static_cast<uint64_t>(v & 0xFFFFFFFFu);
    limb_[q + 1] += static_cast<uint64_t>((v >> 32) & 0xFFFFFFFFu);
    limb_[q + 2] += static_cast<uint64_t>(v >> 64);
    // Each add puts < 2^32 into a limb: carry long before 2^64.
    if (++adds_since_normalize_ == (int64_t(1) << 30)) normalize();
  }
}

void ExactSquareSum::normalize() {
  for (int i = 0; i + 1 < kLimbs; ++i) {
    limb_[i + 1] += limb_[i] >> 32;
    limb_[i] &= 0xFFFFFFFFu;
  }
  adds_since_normalize_ = 0;
}

void ExactSquareSum::merge(const ExactSquareSum& o) {
  normalize();
  ExactSquareSum b = o;
  b.normalize();
  for (int i = 0; i < kLimbs; ++i) limb_[i] += b.limb_[i];
  inf_ = inf_ || o.inf_;
  nan_ = nan_ || o.nan_;
  normalize();
}

std::vector<int64_t> ExactSquareSum::words() const {
  ExactSquareSum c = *this;
  c.normalize();
  std::vector<int64_t> w(kLimbs + 2);
  for (int i = 0; i < kLimbs; ++i) w[i] = static_cast<int64_t>(c.limb_[i]);
  w[kLimbs] = inf_;
  w[kLimbs + 1] = nan_;
  return w;
}

ExactSquareSum ExactSquareSum::from_words(const int64_t* w, int64_t n) {
  ST_CHECK(n == kLimbs + 2, "ExactSquareSum: ", n, " words, expected ", kLimbs + 2);
  ExactSquareSum s;
  for (int i = 0; i < kLimbs; ++i) s.limb_[i] = static_cast<uint64_t>(w[i]);
  s.inf_ = w[kLimbs] != 0;
  s.nan_ = w[kLimbs + 1] != 0;
  s.normalize();
  return s;
}

double ExactSquareSum::value() const {
  if (nan_) return std::numeric_limits<double>::quiet_NaN();
  if (inf_) return std::numeric_limits<double>::infinity();
  ExactSquareSum c = *this;
  c.normalize();
  // From the most significant limb down; the same limbs give the same double everywhere.
  double v = 0;
  for (int i = kLimbs - 1; i >= 0; --i) v += std::ldexp(static_cast<double>(c.limb_[i]), 32 * i - 298);
  return v;
}

}  // namespace shardtrain::fsdp
