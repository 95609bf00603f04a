// Byte sizes as the planner prints them (people's spellings are parsed by util/byte_size.h).
#pragma once
#include <cstdint>
#include <string>

namespace shardtrain::plan {

std::string format_bytes(int64_t bytes);  // "1.23 GiB"

}  // namespace shardtrain::plan
