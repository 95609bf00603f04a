// Byte sizes as people write them on command lines: the one parser of plan --device-memory,
// maxbatch --memory-limit, ckpt export --max-shard-size and bench collectives --min-bytes /
// --max-bytes.
#pragma once
#include <cstdint>
#include <string>

namespace shardtrain {

// A number (integer, decimal or exponent: "4096", "1.5e9", "0.5GiB"), then optionally blanks and
// a unit, any case:
//   B, KB, MB, GB, TB       powers of 1000 (as transformers' max_shard_size, disk makers)
//   KiB, MiB, GiB, TiB      powers of 1024
//   K, M, G, T              powers of 1024 (the bench's "1K", "64M": dd, Slurm)
// -> bytes, rounded down; at least 1 and below 8 EiB. Anything else: UserError naming `what`
// (the option) and the text.
int64_t parse_byte_size(const std::string& text, const std::string& what);

}  // namespace shardtrain
