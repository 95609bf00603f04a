// SaveSchedule: when the loop writes a checkpoint (every N steps, every M minutes, on a stop
// signal, at the end), decided identically on every rank.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>

#include "shardtrain/util/timer.h"

namespace shardtrain::train {

class SaveSchedule {
 public:
  // every_steps / every_minutes: 0 = off. Not collective.
  SaveSchedule(int64_t every_steps, double every_minutes, int rank, MPI_Comm world);

  struct Decision {
    bool save = false;
    bool stop = false;   // a stop signal reached some rank: save and end the job
    int signal = 0;      // which one (highest number over the ranks)
    std::string reason;  // "every_steps", "every_minutes", "signal SIGUSR1", "final" (joined by '+')
  };
  // Collective: one all-reduce per step carries the stop signal of every rank and rank 0's
  // clock, so all ranks save at the same step (clocks on different hosts disagree).
  Decision poll(int64_t step, bool finished);
  // Restarts the wall-clock interval (call after each save).
  void saved() { since_save_.reset(); }

 private:
  int64_t every_steps_;
  double every_minutes_;
  int rank_;
  MPI_Comm world_;
  Timer since_save_;
};

}  // namespace shardtrain::train
