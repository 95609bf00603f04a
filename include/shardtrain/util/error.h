// Errors that carry where they happened (file:line, MPI rank) and whether the user caused them.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace shardtrain {

// Exit codes are part of the interface: jobscripts branch on them.
enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,     // a bug or a failed library call
  kExitUserInput = 2,    // bad deck, flag, data or checkpoint file
  kExitCommTimeout = 3,  // the watchdog found a collective that did not complete
  kExitDiverged = 4,     // a non-finite loss or gradient norm (train.on_nonfinite = "stop")
  kExitIo = 5,           // a write failed (disk full, quota, I/O error); the last good checkpoint stays
  kExitCheckpointed = 42 // stopped on a signal after writing a checkpoint; requeue me
};

// The rank used in messages; set once the runtime knows it (-1 before MPI_Init).
void set_error_rank(int rank);
int error_rank();

class Error : public std::runtime_error {
 public:
  Error(std::string msg, int exit_code = kExitInternal)
      : std::runtime_error(std::move(msg)), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }
  // True when every rank raised this same error (runtime::run_agreed): the program can
  // print it once and exit normally instead of aborting the job.
  bool agreed() const { return agreed_; }
  void set_agreed() { agreed_ = true; }

 private:
  int exit_code_;
  bool agreed_ = false;
};

// Bad input from the user: printed as one clear line, exit code 2.
class UserError : public Error {
 public:
  explicit UserError(std::string msg) : Error(std::move(msg), kExitUserInput) {}
};

// A write that failed for a reason outside the program (ENOSPC, EDQUOT, EIO, read-only
// file system): one clear line naming the file and the reason, exit code 5.
class IoError : public Error {
 public:
  explicit IoError(std::string msg) : Error(std::move(msg), kExitIo) {}
};

namespace detail {
[[noreturn]] void throw_internal(const char* file, int line, const std::string& what);
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail
}  // namespace shardtrain

// ST_CHECK(cond, msg...): internal invariant; throws shardtrain::Error with file:line and rank.
#define ST_CHECK(cond, ...)                                                                  \
  do {                                                                                       \
    if (!(cond))                                                                             \
      ::shardtrain::detail::throw_internal(__FILE__, __LINE__,                               \
          ::shardtrain::detail::concat("check failed: " #cond ". ", ##__VA_ARGS__));         \
  } while (0)

// ST_USER_CHECK(cond, msg...): input validation; throws UserError with the message only.
#define ST_USER_CHECK(cond, ...)                                                             \
  do {                                                                                       \
    if (!(cond)) throw ::shardtrain::UserError(::shardtrain::detail::concat(__VA_ARGS__));  \
  } while (0)
