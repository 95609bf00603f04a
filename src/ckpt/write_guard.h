// What save_snapshot uses to fail the same way on every rank when the storage refuses a write.
#pragma once
#include <mpi.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "shardtrain/util/error.h"

namespace shardtrain::ckpt::detail {

// Collective: the lowest failing rank's message as an agreed Error of its code (kExitIo for
// storage failures) on every rank, or nothing when no rank failed. Unlike run_agreed it does
// not throw, so the caller can still clean up collectively before throwing.
std::optional<Error> agree_failure(MPI_Comm comm, const std::string& local_failure, int code = kExitIo);

// Rank 0, right after H5Fcreate: reserve `bytes` for the file (fallocate, extending it; HDF5
// truncates it to its real end at close). Writes inside the reservation cannot fail for lack
// of space, so a full disk or quota shows up here, where every rank can agree on it, rather
// than inside a collective HDF5 call. Returns a message ("" = reserved, or the file system
// cannot reserve and statvfs says the space is there). SHARDTRAIN_TEST_NO_PREALLOCATE=1 skips
// it (tests of the write path a file system without fallocate takes).
// *reserved tells whether the space is now held (false: skipped, or no fallocate here).
std::string reserve_space(const std::string& tmp, int64_t bytes, int64_t free_before, bool* reserved = nullptr);

// Why a write failed: errno when it names a storage failure, else the free space decides
// between "No space left on device" and "Input/output error".
std::string write_failure_reason(int saved_errno, const std::string& dir, int64_t bytes_needed);

// After an agreed failure: points every descriptor of this process that refers to the file
// at `path` (same device and inode; MPI-IO's own, found in /proc/self/fd) at an anonymous
// memory file (memfd_create). HDF5's collective close still writes the file's metadata and
// sets its size; with the descriptors redirected, those writes cannot fail (the disk is full,
// or broken), so no rank can leave the close early while the others wait in its barriers.
// Returns how many descriptors were redirected (0: none found, or no memfd/proc here).
int redirect_to_memory(const std::string& path);

// A watchdog for collective HDF5 calls that may hang: if the guarded scope does not end
// within `seconds`, it removes `tmp` (best effort; a .tmp is never read), prints `message`
// (with the free space of tmp's file system when it is exhausted) and aborts the job with
// `code` (MPI_Abort), so a flush or close that hangs inside HDF5 / MPI-IO ends the job
// instead of leaving it running forever.
class Deadline {
 public:
  Deadline(double seconds, std::string message, int code, std::string tmp);
  ~Deadline();
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace shardtrain::ckpt::detail
