// Checked writes with errno-based messages; see file_io.h.
#include "shardtrain/util/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
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

namespace {
const char* kind_of(mode_t m) {
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void refuse(const std::string& path, const std::string& what, mode_t m) {
  throw UserError(what + " " + path + " exists and is " + kind_of(m) +
                  ", not a regular file: shardtrain never writes through or replaces it (someone else may have "
                  "put it there; see docs/security.md). Remove it, or write somewhere else");
}

// The exit code of a path that cannot be written (docs/troubleshooting.md, exit codes): the
// storage refusing (no space, quota, I/O error, read-only) is an IoError (5); a path that cannot
// be used as given (a missing directory, a file where a directory goes, no permission) is the
// user's input, a UserError (2), whichever command writes it.
[[noreturn]] void unusable(const std::string& message, int err) {
  if (is_storage_errno(err)) throw IoError(message);
  throw UserError(message);
}
}  // namespace

void check_output_path(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e != ENOENT) unusable(what + " " + path + ": " + errno_text(e), e);
    // Absent: its directory must be there (an output is never created with its directories).
    const std::string dir = parent_dir(path);
    struct stat dst {};
    if (::stat(dir.c_str(), &dst) != 0) {
      const int de = errno;
      unusable(what + " " + path + ": its directory " + dir + " " +
                   (de == ENOENT ? std::string("does not exist") : "cannot be used: " + errno_text(de)),
               de);
    }
    if (!S_ISDIR(dst.st_mode)) throw UserError(what + " " + path + ": " + dir + " is not a directory");
    return;
  }
  if (!S_ISREG(st.st_mode)) refuse(path, what, st.st_mode);
}

void check_output_writable(const std::string& path, const std::string& what) {
  check_output_path(path, what);
  // access() answers for the caller's rights and the mount (EROFS even for root), without
  // leaving anything behind; a full disk or quota shows only when written (exit 5 then).
  const std::string dir = parent_dir(path);
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw UserError(what + " " + path + ": its directory " + dir + " is not writable: " + errno_text(errno));
}

void clear_temp_name(const std::string& tmp, const std::string& what) {
  check_output_path(tmp, what);
  // A regular file: a crashed writer's temporary (never read). unlink removes the name only.
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT)
    throw IoError(what + " " + tmp + ": cannot remove the stale temporary: " + errno_text(errno));
}

int create_temp(const std::string& tmp, const std::string& what) {
  clear_temp_name(tmp, what);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd >= 0) return fd;
  const int e = errno;
  if (e == EEXIST || e == ELOOP)
    throw UserError(what + " " + tmp + ": the name appeared while it was being created (someone else is writing "
                    "in this directory; see docs/security.md)");
  unusable(what + " " + tmp + ": cannot create it: " + errno_text(e), e);
}

void commit_temp(const std::string& tmp, const std::string& path, const std::string& what) {
  try {
    check_output_path(path, what);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw IoError(what + " " + path + ": cannot rename " + tmp + " to it: " + errno_text(e));
  }
  if (int e = fsync_dir(parent_dir(path))) throw IoError(what + " " + path + ": fsync of the directory failed: " + errno_text(e));
}

int open_in_place(const std::string& path, int flags, const std::string& what) {
  int fd = ::open(path.c_str(), flags | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) refuse(path, what, st.st_mode);
    errno = e;
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t m = st.st_mode;
    ::close(fd);
    refuse(path, what, m);
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

OutputFile::OutputFile(std::string path, std::string what)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), what_(std::move(what)) {
  check_output_path(path_, what_);  // refused before anything is written
  fd_ = create_temp(tmp_, what_);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void OutputFile::write(const void* data, size_t n) {
  if (fd_ < 0) throw IoError(what_ + " " + path_ + ": written after commit");
  if (int err = write_all(fd_, static_cast<const char*>(data), n)) {
    throw IoError(what_ + " " + path_ + ": write failed: " + errno_text(err) +
                  (err == ENOSPC || err == EDQUOT ? " (" + std::to_string(written_ + n) + " bytes to write)" : ""));
  }
  written_ += n;
}

void OutputFile::commit() {
  int err = ::fsync(fd_) == 0 ? 0 : errno;
  if (::close(fd_) != 0 && err == 0) err = errno;  // NFS reports deferred write errors here
  fd_ = -1;
  if (err && err != EINVAL) {
    ::unlink(tmp_.c_str());
    throw IoError(what_ + " " + path_ + ": write failed: " + errno_text(err) + " (" + std::to_string(written_) +
                  " bytes to write)");
  }
  commit_temp(tmp_, path_, what_);
}

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  OutputFile f(path, "file");
  f.write(data, size);
  f.commit();
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, text.data(), text.size());
}

void AppendFile::open(const std::string& path, bool truncate) {
  close();
  path_ = path;
  fd_ = open_in_place(path, O_WRONLY, "output file");
  if (fd_ < 0) throw IoError(path + ": cannot open for writing: " + errno_text(errno));
  if (truncate && ::ftruncate(fd_, 0) != 0) {
    int e = errno;
    close();
    throw IoError(path + ": cannot truncate: " + errno_text(e));
  }
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
