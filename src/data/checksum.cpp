// FNV-1a 64: tiny, dependency-free, good enough to tell two source texts apart.
#include "shardtrain/data/checksum.h"

#include <cstdio>

namespace shardtrain::data {

std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace shardtrain::data
