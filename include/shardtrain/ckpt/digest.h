// Digest: the position-weighted checksum stored on every checkpoint dataset.
#pragma once
#include <cstdint>
#include <vector>

namespace shardtrain::ckpt {

// Over the dataset's elements as unsigned words w_i of the element size (float32 -> its
// uint32 bits, int64 -> uint64, uint8 -> byte), i = row-major index from 0:
//   sum = sum_i w_i  (mod 2^64),   weighted = sum_i (i+1) * w_i  (mod 2^64).
// Both are sums, so ranks digest their own pieces and an MPI sum combines them; any
// changed word changes `sum`, and swapped words change `weighted`. Stored as the
// uint64[2] attribute "digest" = {sum, weighted}.
struct Digest {
  uint64_t sum = 0, weighted = 0;
  // Adds `n` words of `word_bytes` (1, 4 or 8) that sit at element index `first`.
  void add(const void* data, int64_t n, int word_bytes, int64_t first);
  std::vector<uint64_t> as_vector() const { return {sum, weighted}; }
  bool operator==(const Digest& o) const { return sum == o.sum && weighted == o.weighted; }
  bool operator!=(const Digest& o) const { return !(*this == o); }
};

}  // namespace shardtrain::ckpt
