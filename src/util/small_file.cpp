// read_small_file / check_regular_file: bounded reads of regular files only.
#include "shardtrain/util/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "shardtrain/util/error.h"

namespace shardtrain {
namespace {

const char* kind_of(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISDIR(m)) return "a directory";
  return "not a regular file";
}

[[noreturn]] void fail(const std::string& path, const std::string& msg) { throw UserError(path + ": " + msg); }

void check_stat(const std::string& path, const struct stat& st, std::uint64_t max_bytes, const std::string& what) {
  if (S_ISDIR(st.st_mode)) fail(path, "is a directory, not a " + what + " file");
  if (!S_ISREG(st.st_mode))
    fail(path, std::string("is ") + kind_of(st.st_mode) + ", not a regular file; a " + what +
                   " must be a regular file");
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes)
    fail(path, std::to_string(st.st_size) + " bytes is too big for a " + what + " (at most " +
                   size_text(max_bytes) + "); is this the right file?");
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void check_json_depth(const std::string& t, int max_depth, const std::string& what) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        throw UserError(what + ": JSON nested deeper than " + std::to_string(max_depth) + " levels at byte " +
                        std::to_string(i) + " (not a file shardtrain reads)");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

std::string size_text(std::uint64_t b) {
  if (b >= kGiB && b % kGiB == 0) return std::to_string(b / kGiB) + " GiB";
  if (b >= kMiB && b % kMiB == 0) return std::to_string(b / kMiB) + " MiB";
  if (b >= kKiB && b % kKiB == 0) return std::to_string(b / kKiB) + " KiB";
  return std::to_string(b) + " bytes";
}

std::uint64_t check_regular_file(const std::string& path, std::uint64_t max_bytes, const std::string& what) {
  if (path.empty()) throw UserError("no " + what + " file given (the path is empty)");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) fail(path, what + " file not found");
    fail(path, "cannot read " + what + " file: " + std::strerror(err));
  }
  check_stat(path, st, max_bytes, what);
  return static_cast<std::uint64_t>(st.st_size);
}

std::string read_small_file(const std::string& path, std::uint64_t max_bytes, const std::string& what) {
  check_regular_file(path, max_bytes, what);
  // O_NONBLOCK: if the path was swapped for a FIFO since the stat, open does not wait for a
  // writer; fstat below then refuses it.
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (f.fd < 0) fail(path, "cannot read " + what + " file: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail(path, "cannot read " + what + " file: " + std::strerror(errno));
  check_stat(path, st, max_bytes, what);
  std::string out;
  out.resize(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  for (;;) {
    if (got == out.size()) {
      // The file may have grown since fstat: read on, but never past the cap.
      if (out.size() > max_bytes) break;
      out.resize(std::min<std::uint64_t>(max_bytes + 1, out.size() + 64 * kKiB));
    }
    ssize_t n = ::read(f.fd, out.data() + got, out.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, "cannot read " + what + " file: " + std::strerror(errno));
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > max_bytes)
    fail(path, "more than " + size_text(max_bytes) + " is too big for a " + what + "; is this the right file?");
  out.resize(got);
  return out;
}

}  // namespace shardtrain
