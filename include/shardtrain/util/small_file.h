// Reading a whole input file with bounds: only regular files, and at most a given size.
// A FIFO, /dev/zero or a socket passed where a file is expected would otherwise block or
// read forever; a huge file where a small text is expected would exhaust memory.
#pragma once
#include <cstdint>
#include <string>

namespace shardtrain {

inline constexpr std::uint64_t kKiB = 1024, kMiB = 1024 * kKiB, kGiB = 1024 * kMiB;

// The whole of `path`. UserError "<path>: ..." (one line) when the path is empty, missing,
// a directory, not a regular file (FIFO, device, socket), unreadable, or larger than
// `max_bytes`. `what` names the file's role in messages ("deck", "dataset meta.json", ...).
// Never blocks on a FIFO: the type is checked before and after a non-blocking open.
std::string read_small_file(const std::string& path, std::uint64_t max_bytes, const std::string& what);

// The same checks without reading: the file's size in bytes (for callers that map or
// pread the file themselves).
std::uint64_t check_regular_file(const std::string& path, std::uint64_t max_bytes, const std::string& what);

// JSON nested deeper than `max_depth` arrays/objects: UserError "<what>: ..." naming the byte
// offset. Called before nlohmann parses a file: its dump() (used in messages) recurses once
// per level, so a crafted file a million levels deep would overflow the stack. Strings are
// skipped; the scan itself is a loop.
void check_json_depth(const std::string& text, int max_depth, const std::string& what);
inline constexpr int kMaxJsonDepth = 64;

// "1 MiB", "64 MiB", "4 GiB", "1234 bytes": a size for messages.
std::string size_text(std::uint64_t bytes);

}  // namespace shardtrain
