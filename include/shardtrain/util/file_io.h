// Checked file writes: every byte reaches the file, or an IoError names the file and the reason.
#pragma once
#include <sys/types.h>

#include <cstddef>
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

// ---- Creating files: the one way every writer does it (docs/security.md) ----------------
// Directories are shared and may hold names planted by someone else. No writer opens an
// existing name through a symbolic link, writes into a device node or FIFO, or renames over
// anything but a regular file:
//  * outputs are written to a temporary `path.tmp` created exclusively (O_CREAT|O_EXCL|
//    O_NOFOLLOW: a name planted there, link or not, makes the create fail; a stale regular
//    file left by a crashed writer is removed first) and renamed onto `path` after
//    check_output_path;
//  * files written in place (the lock, metrics.jsonl, samples.jsonl) are opened with
//    O_NOFOLLOW and refused unless fstat says regular file.
// What stays open (a name swapped between the lstat and the rename, directories above the
// file that are themselves links) is listed in docs/security.md.

// An existing `path` that is not a regular file (symbolic link, directory, FIFO, device node,
// socket): UserError (exit 2) "<what> <path> exists and is a symbolic link; ...". Absent or a
// regular file: returns (the caller may replace it).
// Also an absent `path` whose directory does not exist or is not a directory: UserError
// "its directory ... does not exist" (an output is never created with its directories).
void check_output_path(const std::string& path, const std::string& what);
// check_output_path, and `path`'s directory writable by this process (not a read-only file
// system): UserError naming it. For a command's outputs before it starts its work, so that an
// output that cannot be written is exit 2 with nothing done, as train's start-up checks make it;
// a write the storage refuses once the work runs is an IoError (exit 5).
void check_output_writable(const std::string& path, const std::string& what);

// Makes `tmp` free for an exclusive create: a stale regular file there is removed, anything
// else is refused as in check_output_path. For writers whose library creates the file itself
// (HDF5 with H5F_ACC_EXCL, MPI-IO with MPI_MODE_EXCL).
void clear_temp_name(const std::string& tmp, const std::string& what);

// clear_temp_name, then open(tmp, O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC, 0644).
// Returns the descriptor; IoError when the storage refuses (is_storage_errno), else UserError
// (EEXIST: a name was planted between the check and the create; a missing directory, no
// permission) naming the file.
int create_temp(const std::string& tmp, const std::string& what);

// check_output_path(path), then rename(tmp, path) and fsync of the directory. On failure tmp
// is removed and the error names both files.
void commit_temp(const std::string& tmp, const std::string& path, const std::string& what);

// Opens `path` for writing in place (flags: O_WRONLY or O_RDWR, optionally O_APPEND), creating
// it (0644) if absent, never through a symbolic link (O_NOFOLLOW) and never blocking on a
// FIFO (O_NONBLOCK, cleared after the check); anything but a regular file is refused as in
// check_output_path (UserError). Never truncates: callers ftruncate after the check.
// Returns the descriptor, or -1 with errno set when the open itself fails (EACCES, EROFS,
// ENOENT, ...): the caller names the file's role in its message.
int open_in_place(const std::string& path, int flags, const std::string& what);

// An output file under construction: `path`.tmp created by create_temp, written with checked
// writes, renamed onto `path` by commit() (fsync, close, commit_temp). Destroyed without
// commit() (an exception), the temporary is removed: nothing half-written stays behind.
class OutputFile {
 public:
  OutputFile(std::string path, std::string what);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  void write(const void* data, size_t n);  // IoError naming the file
  void write(const std::string& s) { write(s.data(), s.size()); }
  void commit();
  const std::string& tmp_path() const { return tmp_; }

 private:
  std::string path_, tmp_, what_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

// Writes `text` to path.tmp (OutputFile), fsyncs it and renames it to `path`: readers see the
// old file or the whole new one, never an empty or half-written file. On failure path.tmp is
// removed, `path` is untouched, and IoError says which file and why.
void write_file_atomic(const std::string& path, const std::string& text);
void write_file_atomic(const std::string& path, const void* data, size_t size);

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
