// R lazy-load database reader. The .rdx (gzip of a serialized list) holds
// list(variables = list(<name> = c(offset, length), ...), references = ..., compressed = ...);
// each .rdb block at offset is a 4-byte big-endian inflated length followed by a zlib stream of
// one serialized object.
#include "shardtrain/data/r_lazyload.h"

#include "shardtrain/data/paths.h"
#include "shardtrain/data/zlib_inflate.h"
#include "shardtrain/util/error.h"

namespace shardtrain::data {

RLazyLoadDb::RLazyLoadDb(const std::string& rdx_path) : rdx_path_(rdx_path) {
  ST_USER_CHECK(rdx_path.size() > 4 && rdx_path.substr(rdx_path.size() - 4) == ".rdx", "'", rdx_path,
                "' is not an R lazy-load index (.rdx)");
  rdb_path_ = rdx_path.substr(0, rdx_path.size() - 4) + ".rdb";
  std::string raw = read_file(rdx_path, kMaxAuxFileBytes, "R lazy-load index");
  RValue index = parse_r_serialized(inflate_any(raw, -1, "'" + rdx_path + "'"), "'" + rdx_path + "'");
  const RValue* vars = index.element("variables");
  ST_USER_CHECK(vars && vars->type == RValue::Type::List, "'", rdx_path, "' has no 'variables' list");
  const RValue* names = vars->attribute("names");
  ST_USER_CHECK(names && names->type == RValue::Type::String && names->strings.size() == vars->elements.size(),
                "'", rdx_path, "': 'variables' has no names");
  for (std::size_t i = 0; i < vars->elements.size(); ++i) {
    const RValue& span = vars->elements[i];
    ST_USER_CHECK(span.type == RValue::Type::Integer && span.ints.size() == 2 && span.ints[0] >= 0 &&
                      span.ints[1] > 4,
                  "'", rdx_path, "': variable ", i, " has no valid (offset, length) pair");
    names_.push_back(names->strings[i].value_or("NA"));
    spans_.emplace_back(span.ints[0], span.ints[1]);
  }
  if (const RValue* c = index.element("compressed")) {
    ST_USER_CHECK(!c->ints.empty(), "'", rdx_path, "': 'compressed' is empty");
    compression_ = c->ints[0];  // TRUE (1) = zlib, 2 = bzip2, 3 = xz
  }
  ST_USER_CHECK(compression_ == 1, "'", rdx_path, "' uses compression ", compression_,
                " (only zlib, 1, is supported; bzip2 = 2 and xz = 3 are not)");
}

RValue RLazyLoadDb::fetch(const std::string& name) const {
  std::size_t i = 0;
  while (i < names_.size() && names_[i] != name) ++i;
  ST_USER_CHECK(i < names_.size(), "'", rdx_path_, "' has no variable '", name, "'");
  auto [offset, length] = spans_[i];
  // Read only this block.
  std::string rdb = read_file(rdb_path_, kMaxAuxFileBytes, "R lazy-load database");
  ST_USER_CHECK(static_cast<std::size_t>(offset + length) <= rdb.size(), "'", rdb_path_, "': block '", name,
                "' at offset ", offset, " length ", length, " runs past the end of the file (", rdb.size(),
                " bytes)");
  std::string where = "'" + rdb_path_ + "' block '" + name + "' at offset " + std::to_string(offset);
  const auto* p = reinterpret_cast<const unsigned char*>(rdb.data() + offset);
  long long inflated = (static_cast<long long>(p[0]) << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
  std::string body = inflate_any(std::string_view(rdb).substr(offset + 4, length - 4), inflated, where);
  return parse_r_serialized(body, where);
}

}  // namespace shardtrain::data
