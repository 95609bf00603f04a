// Checked file writes: every byte reaches the file, or an IoError names the file and the reason.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <string>

namespace shardtrain::io {

// strerror for an errno value ("No space left on device").
std::string errno_text(int err);
// True for the errno values that mean "the storage refused the write" (ENOSPC, EDQUOT, EIO,
// EROFS, EFBIG): the IoError class of failures, as opposed to a program bug.
bool is_storage_errno(int err);
// Bytes an unprivileged process may still write to the file system holding `path`
// (statvfs f_bavail * f_frsize); -1 when the file system does not say (f_blocks == 0) or
// statvfs fails.
int64_t available_bytes(const std::string& path);
// The directory part of a path ("." for a bare name).
std::string parent_dir(const std::string& path);
// fsync of a directory, so a rename inside it survives a crash. Returns errno (0 = ok).
int fsync_dir(const std::string& dir);

// Writes `text` to path.tmp, fsyncs it and renames it to `path`: readers see the old file
// or the whole new one, never an empty or half-written file. On failure path.tmp is
// removed, `path` is untouched, and IoError says which file and why.
void write_file_atomic(const std::string& path, const std::string& text);

// An append-only file written record by record (metrics.jsonl). Each append() writes the
// whole record or nothing: after a failed or short write the file is truncated back to its
// previous length, so no torn line is left behind, and IoError is thrown.
class AppendFile {
 public:
  AppendFile() = default;
  // truncate = true empties the file. IoError if it cannot be opened.
  void open(const std::string& path, bool truncate);
  bool is_open() const { return fd_ >= 0; }
  void append(const std::string& record);
  // fdatasync: on NFS and some parallel file systems ENOSPC/EDQUOT only show up here.
  void sync();
  void close();  // errors ignored (use sync() first where they matter)
  ~AppendFile() { close(); }
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  off_t size_ = 0;  // bytes of whole records in the file
  std::string path_;
};

}  // namespace shardtrain::io
