// SaveSchedule: the per-step save/stop decision, from what the step's agreement carried.
#include "save_schedule.h"

#include <csignal>

namespace shardtrain::train {

SaveSchedule::SaveSchedule(int64_t every_steps, double every_minutes, int rank)
    : every_steps_(every_steps), every_minutes_(every_minutes), rank_(rank) {}

bool SaveSchedule::clock_due() const {
  return rank_ == 0 && every_minutes_ > 0 && since_save_.seconds() >= 60.0 * every_minutes_;
}

SaveSchedule::Decision SaveSchedule::decide(int64_t step, bool finished, const StepAgreed& agreed) const {
  Decision d;
  auto add = [&d](const std::string& why) {
    d.save = true;
    d.reason += (d.reason.empty() ? "" : "+") + why;
  };
  if (every_steps_ > 0 && step % every_steps_ == 0) add("every_steps");
  if (agreed.clock_due) add("every_minutes");
  if (agreed.signal) {
    d.stop = true;
    d.signal = agreed.signal;
    add(d.signal == SIGUSR1 ? "signal SIGUSR1" : d.signal == SIGTERM ? "signal SIGTERM" : "signal " + std::to_string(d.signal));
  }
  if (finished) add("final");
  return d;
}

}  // namespace shardtrain::train
