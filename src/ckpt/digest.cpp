// Digest::add: the (sum, weighted sum) checksum over unsigned words, in wrapping uint64 math.
#include "shardtrain/ckpt/digest.h"

#include <cstring>

#include "shardtrain/util/error.h"

namespace shardtrain::ckpt {
namespace {
template <typename W>
void add_words(const void* data, int64_t n, int64_t first, uint64_t& sum, uint64_t& weighted) {
  const auto* p = static_cast<const unsigned char*>(data);
  // sum_j (first+j+1) w_j = (first+1)*sum_j w_j + sum_j j*w_j; four independent lanes.
  uint64_t s[4] = {0, 0, 0, 0}, t[4] = {0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    for (int k = 0; k < 4; ++k) {
      W w;
      std::memcpy(&w, p + (j + k) * sizeof(W), sizeof(W));
      s[k] += static_cast<uint64_t>(w);
      t[k] += static_cast<uint64_t>(j + k) * static_cast<uint64_t>(w);
    }
  }
  uint64_t S = s[0] + s[1] + s[2] + s[3], T = t[0] + t[1] + t[2] + t[3];
  for (; j < n; ++j) {
    W w;
    std::memcpy(&w, p + j * sizeof(W), sizeof(W));
    S += static_cast<uint64_t>(w);
    T += static_cast<uint64_t>(j) * static_cast<uint64_t>(w);
  }
  sum += S;
  weighted += (static_cast<uint64_t>(first) + 1) * S + T;
}
}  // namespace

void Digest::add(const void* data, int64_t n, int word_bytes, int64_t first) {
  if (n <= 0) return;
  switch (word_bytes) {
    case 1: add_words<uint8_t>(data, n, first, sum, weighted); break;
    case 4: add_words<uint32_t>(data, n, first, sum, weighted); break;
    case 8: add_words<uint64_t>(data, n, first, sum, weighted); break;
    default: ST_CHECK(false, "digest word size ", word_bytes);
  }
}

}  // namespace shardtrain::ckpt
