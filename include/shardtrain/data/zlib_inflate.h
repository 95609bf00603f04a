// zlib / gzip decompression for the R lazy-load files (.rdx is gzip, .rdb blocks are zlib).
#pragma once
#include <string>
#include <string_view>

namespace shardtrain::data {

// Inflates a zlib or gzip stream (auto-detected). `expected_size` (or -1 if unknown) is
// checked; `what` names the data in the UserError a corrupt stream raises.
std::string inflate_any(std::string_view compressed, long long expected_size, const std::string& what);

}  // namespace shardtrain::data
