// zlib/gzip inflation with every zlib return code checked.
#include "shardtrain/data/zlib_inflate.h"

#include <zlib.h>

#include <climits>

#include "shardtrain/util/error.h"

namespace shardtrain::data {

std::string inflate_any(std::string_view compressed, long long expected_size, const std::string& what) {
  z_stream zs{};
  // 15 + 32: maximum window, and detect a zlib or a gzip header automatically.
  int rc = inflateInit2(&zs, 15 + 32);
  ST_CHECK(rc == Z_OK, "inflateInit2 failed (", rc, ") for ", what);
  std::string out;
  out.resize(expected_size > 0 ? static_cast<std::size_t>(expected_size) : compressed.size() * 4 + 1024);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  ST_USER_CHECK(compressed.size() < UINT_MAX, what, ": compressed block too large");
  zs.avail_in = static_cast<uInt>(compressed.size());
  std::size_t done = 0;
  for (;;) {
    if (done == out.size()) out.resize(out.size() * 2);
    std::size_t room = std::min<std::size_t>(out.size() - done, UINT_MAX);
    zs.next_out = reinterpret_cast<Bytef*>(&out[done]);
    zs.avail_out = static_cast<uInt>(room);
    rc = inflate(&zs, Z_NO_FLUSH);
    done += room - zs.avail_out;
    if (rc == Z_STREAM_END) break;
    if (rc == Z_OK || (rc == Z_BUF_ERROR && zs.avail_out == 0)) continue;
    std::string msg = zs.msg ? zs.msg : "no message";
    inflateEnd(&zs);
    throw UserError(what + ": corrupt or truncated compressed data (zlib error " + std::to_string(rc) + ": " +
                    msg + ") after " + std::to_string(zs.total_in) + " compressed bytes");
  }
  inflateEnd(&zs);
  out.resize(done);
  ST_USER_CHECK(expected_size < 0 || static_cast<long long>(done) == expected_size, what, ": inflated to ", done,
                " bytes, the header says ", expected_size);
  return out;
}

}  // namespace shardtrain::data
