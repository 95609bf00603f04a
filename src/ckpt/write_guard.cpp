// agree_failure, reserve_space, write_failure_reason, Deadline: see write_guard.h.
#include "write_guard.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/runtime.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/log.h"

namespace shardtrain::ckpt::detail {

std::optional<Error> agree_failure(MPI_Comm comm, const std::string& local_failure, int code) {
  try {
    runtime::run_agreed(comm, [&] {
      if (!local_failure.empty()) throw Error(local_failure, code);
    });
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

namespace {
std::string space_note(int64_t needed, int64_t free_before) {
  std::string s = " (" + std::to_string(needed) + " bytes needed for the file";
  if (free_before >= 0) s += ", " + std::to_string(free_before) + " available when the write began";
  return s + ")";
}
}  // namespace

std::string reserve_space(const std::string& tmp, int64_t bytes, int64_t free_before, bool* reserved) {
  if (reserved) *reserved = false;
  const char* skip = std::getenv("SHARDTRAIN_TEST_NO_PREALLOCATE");
  if (skip && std::strcmp(skip, "1") == 0) return "";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "write failed: " + io::errno_text(errno);
  // Mode 0 (not KEEP_SIZE): the size grows to the reservation, and HDF5's truncate at close
  // (MPI_File_set_size to its end of allocation) gives back whatever the estimate overshot.
  int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(bytes));
  int err = rc == 0 ? 0 : errno;
  ::close(fd);
  if (reserved) *reserved = err == 0;
  if (err == 0) return "";
  if (err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) {
    // No fallocate here (some NFS and FUSE file systems): compare with statvfs instead; the
    // writes' own errors are still agreed (save_snapshot), only less early.
    if (free_before >= 0 && free_before < bytes)
      return "write failed: " + io::errno_text(ENOSPC) + space_note(bytes, free_before);
    return "";
  }
  return "write failed: " + io::errno_text(err) + space_note(bytes, free_before);
}

std::string write_failure_reason(int saved_errno, const std::string& dir, int64_t bytes_needed) {
  if (io::is_storage_errno(saved_errno)) {
    std::string why = io::errno_text(saved_errno);
    if (saved_errno == ENOSPC || saved_errno == EDQUOT)
      why += " (" + std::to_string(bytes_needed) + " bytes needed for the file, " +
             std::to_string(io::available_bytes(dir)) + " available now)";
    return why;
  }
  // MPI-IO and HDF5 do not always leave errno behind; the file system's state does.
  const int64_t avail = io::available_bytes(dir);
  if (avail >= 0 && avail < bytes_needed)
    return io::errno_text(ENOSPC) + " (" + std::to_string(bytes_needed) + " bytes needed for the file, " +
           std::to_string(avail) + " available now)";
  return io::errno_text(EIO);
}

int redirect_to_memory(const std::string& path) {
  struct stat want {};
  if (::stat(path.c_str(), &want) != 0) return 0;
  int mem = ::memfd_create("shardtrain-abandoned-checkpoint", MFD_CLOEXEC);
  if (mem < 0) return 0;
  int redirected = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    const int own = ::dirfd(d);
    while (const dirent* e = ::readdir(d)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (*end != '\0' || end == e->d_name || fd == own || fd == mem) continue;
      struct stat st {};
      if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (st.st_dev != want.st_dev || st.st_ino != want.st_ino) continue;
      // dup2 swaps the descriptor atomically: MPI-IO keeps using the same number.
      if (::dup2(mem, static_cast<int>(fd)) >= 0) ++redirected;
    }
    ::closedir(d);
  }
  ::close(mem);
  return redirected;
}

Deadline::Deadline(double seconds, std::string message, int code, std::string tmp) {
  thread_ = std::thread([this, seconds, message = std::move(message), code, tmp = std::move(tmp)] {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; })) return;
    const int64_t avail = io::available_bytes(io::parent_dir(tmp));
    std::string why = message + " within " + std::to_string(static_cast<int>(seconds)) + " s";
    // The usual cause: a write refused for lack of space on some ranks inside HDF5's barriers.
    if (avail >= 0 && avail < (1 << 20)) why += ": " + io::errno_text(ENOSPC) + " (" + std::to_string(avail) + " bytes available)";
    ::unlink(tmp.c_str());
    log::error(why + " (aborting the job)");
    runtime::Runtime::abort(code);
  });
}

Deadline::~Deadline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace shardtrain::ckpt::detail
