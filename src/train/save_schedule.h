// SaveSchedule: when the loop writes a checkpoint (every N steps, every M minutes, on a stop
// signal, at the end), decided identically on every rank.
#pragma once
#include <cstdint>
#include <string>

#include "shardtrain/util/timer.h"
#include "step_result.h"

namespace shardtrain::train {

class SaveSchedule {
 public:
  // every_steps / every_minutes: 0 = off. Not collective.
  SaveSchedule(int64_t every_steps, double every_minutes, int rank);

  struct Decision {
    bool save = false;
    bool stop = false;   // a stop signal reached some rank: save and end the job
    int signal = 0;      // which one (highest number over the ranks)
    std::string reason;  // "every_steps", "every_minutes", "signal SIGUSR1", "final" (joined by '+')
  };
  // Not collective: the step's agreement (StepAgreement) carried the stop signal of every rank
  // and rank 0's clock, so all ranks save at the same step (clocks on different hosts disagree).
  Decision decide(int64_t step, bool finished, const StepAgreed& agreed) const;
  // Rank 0: checkpoint.every_minutes has passed since the last save (what the agreement carries).
  bool clock_due() const;
  // Restarts the wall-clock interval (call after each save).
  void saved() { since_save_.reset(); }

 private:
  int64_t every_steps_;
  double every_minutes_;
  int rank_;
  Timer since_save_;
};

}  // namespace shardtrain::train
