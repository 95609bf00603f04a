// SaveSchedule: the per-step save/stop decision, agreed with one MPI_Allreduce(MAX).
#include "save_schedule.h"

#include <csignal>

#include "shardtrain/runtime/blocking_region.h"
#include "shardtrain/train/signals.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::train {

SaveSchedule::SaveSchedule(int64_t every_steps, double every_minutes, int rank, MPI_Comm world)
    : every_steps_(every_steps), every_minutes_(every_minutes), rank_(rank), world_(world) {}

SaveSchedule::Decision SaveSchedule::poll(int64_t step, bool finished) {
  // [0] stop signal of any rank, [1] rank 0's clock says the interval is over.
  int64_t local[2] = {stop_signal(), 0}, global[2] = {0, 0};
  if (rank_ == 0 && every_minutes_ > 0 && since_save_.seconds() >= 60.0 * every_minutes_) local[1] = 1;
  {
    runtime::BlockingRegion region(world_, "step.save_decision");
    ST_MPI_CHECK(MPI_Allreduce(local, global, 2, MPI_INT64_T, MPI_MAX, world_));
  }
  Decision d;
  auto add = [&d](const std::string& why) {
    d.save = true;
    d.reason += (d.reason.empty() ? "" : "+") + why;
  };
  if (every_steps_ > 0 && step % every_steps_ == 0) add("every_steps");
  if (global[1]) add("every_minutes");
  if (global[0]) {
    d.stop = true;
    d.signal = static_cast<int>(global[0]);
    add(d.signal == SIGUSR1 ? "signal SIGUSR1" : d.signal == SIGTERM ? "signal SIGTERM" : "signal " + std::to_string(d.signal));
  }
  if (finished) add("final");
  return d;
}

}  // namespace shardtrain::train
