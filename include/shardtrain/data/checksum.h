// FNV-1a 64-bit checksum, recorded in meta.json to identify the exact source text.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace shardtrain::data {

std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t h = 0xcbf29ce484222325ULL);
// 16 lowercase hex digits.
std::string hex64(std::uint64_t v);

}  // namespace shardtrain::data
