// Checked writes with errno-based messages; see file_io.h.
#include "shardtrain/util/file_io.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "shardtrain/util/error.h"

namespace shardtrain::io {
namespace {
// write(2) until done: a short write is not an error by itself, the next call says why.
int write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;  // no progress and no errno: report it rather than spin
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}
}  // namespace

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message (possibly not in buf).
  return std::string(strerror_r(err, buf, sizeof buf));
}

bool is_storage_errno(int err) {
  return err == ENOSPC || err == EDQUOT || err == EIO || err == EROFS || err == EFBIG;
}

int64_t available_bytes(const std::string& path) {
  struct statvfs s {};
  if (::statvfs(path.c_str(), &s) != 0 || s.f_blocks == 0) return -1;
  return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

int fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return errno;
  int rc = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  // Some file systems (and tmpfs) do not sync directories; that is not a failed write.
  return rc == EINVAL || rc == ENOTSUP ? 0 : rc;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  auto fail = [&](const std::string& what, int err) {
    ::unlink(tmp.c_str());
    throw IoError(path + ": " + what + ": " + errno_text(err) +
                  (err == ENOSPC || err == EDQUOT ? " (" + std::to_string(text.size()) + " bytes to write)" : ""));
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create " + tmp, errno);
  int err = write_all(fd, text.data(), text.size());
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;  // NFS reports deferred write errors here
  if (err) fail("write failed", err);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename " + tmp, errno);
  if (int e = fsync_dir(parent_dir(path))) fail("fsync of the directory failed", e);
}

void AppendFile::open(const std::string& path, bool truncate) {
  close();
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0644);
  if (fd_ < 0) throw IoError(path + ": cannot open for writing: " + errno_text(errno));
  size_ = ::lseek(fd_, 0, SEEK_END);
  if (size_ < 0) {
    int e = errno;
    close();
    throw IoError(path + ": cannot seek: " + errno_text(e));
  }
}

void AppendFile::append(const std::string& record) {
  if (fd_ < 0) return;
  int err = write_all(fd_, record.data(), record.size());
  if (err == 0) {
    size_ += static_cast<off_t>(record.size());
    return;
  }
  // Cut the partial record off again (freeing blocks never needs space) and position the
  // file offset at the end of the last whole record for a later append.
  const bool cut = ::ftruncate(fd_, size_) == 0 && ::lseek(fd_, size_, SEEK_SET) == size_;
  throw IoError(path_ + ": write failed: " + errno_text(err) + " (a record of " + std::to_string(record.size()) +
                " bytes" + (cut ? "; the file keeps its whole records)" : "; the last line may be cut)"));
}

void AppendFile::sync() {
  if (fd_ >= 0 && ::fdatasync(fd_) != 0 && errno != EINVAL)
    throw IoError(path_ + ": write failed: " + errno_text(errno));
}

void AppendFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace shardtrain::io
