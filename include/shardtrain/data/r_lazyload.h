// R lazy-load databases (<name>.rdx index + <name>.rdb blocks), as installed data packages
// store their data sets.
#pragma once
#include <string>
#include <vector>

#include "shardtrain/data/r_serialize.h"

namespace shardtrain::data {

class RLazyLoadDb {
 public:
  // Reads and parses the index; the .rdb beside it is read on fetch().
  explicit RLazyLoadDb(const std::string& rdx_path);
  // The variable names, in index order.
  const std::vector<std::string>& names() const { return names_; }
  // Decompresses and parses one variable's block. UserError for unknown names, out-of-range
  // offsets and corrupt blocks, naming the .rdb file and the offset.
  RValue fetch(const std::string& name) const;

 private:
  std::string rdx_path_, rdb_path_;
  std::vector<std::string> names_;
  std::vector<std::pair<long long, long long>> spans_;  // offset, length in the .rdb
  int compression_ = 1;                                 // 1 zlib (2 bzip2, 3 xz: refused)
};

}  // namespace shardtrain::data
