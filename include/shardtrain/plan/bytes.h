// Byte sizes as people write them (--device-memory, --memory-limit) and as the planner prints them.
#pragma once
#include <cstdint>
#include <string>

namespace shardtrain::plan {

// "80GiB", "1.5e9", "512MiB", "2GB", plain bytes -> bytes (UserError naming `what` otherwise).
int64_t parse_bytes(const std::string& text, const std::string& what);
std::string format_bytes(int64_t bytes);  // "1.23 GiB"

}  // namespace shardtrain::plan
