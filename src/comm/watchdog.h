// Watchdog: one thread per process that turns an overdue collective into a report naming
// the group, the sequence number, the op and the ranks that have not arrived, then aborts.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/comm/comm.h"

namespace shardtrain::comm::detail {

// What the watchdog needs from one group's Comm. Called from the watchdog thread.
class Watched {
 public:
  virtual ~Watched() = default;

  // This rank's progress in the group: the highest sequence number issued by the caller,
  // entered (the backend started running it) and completed. 0 = none yet.
  struct Progress {
    uint64_t issued = 0, entered = 0, completed = 0;
  };
  virtual Progress progress() = 0;

  // A collective that must end the job: overdue, or failed asynchronously (NCCL).
  struct Fatal {
    uint64_t seq = 0;
    std::string op, dtype;
    int64_t numel = 0;
    double running_s = 0;  // how long it has been outstanding
    std::string reason;    // e.g. "timed out after 3 s", "NCCL async error: ..."
  };
  // Polls the backend (e.g. NCCL events) and returns a Fatal when one is due.
  virtual std::optional<Fatal> check(double now) = 0;

  virtual std::string watched_name() const = 0;
  virtual std::vector<FlightRecord> watched_records() const = 0;
  // Last chance to stop the backend before MPI_Abort (NCCL: ncclCommAbort).
  virtual void abort_backend() {}
};

// Registers `w` while it lives. `query_comm` is a duplicate of the group's communicator
// reserved for watchdog messages (the watchdog thread is its only user). Collective-free.
void watchdog_add(Watched* w, MPI_Comm query_comm);
// Unregisters; when the last group leaves, the watchdog thread stops and is joined, so
// nothing polls MPI after the comms are gone (clean MPI_Finalize).
void watchdog_remove(Watched* w);

// Seconds the watchdog sleeps between polls and waits for peers' replies.
constexpr double kWatchdogPollS = 0.02;
constexpr double kWatchdogReplyWaitS = 2.0;

}  // namespace shardtrain::comm::detail
