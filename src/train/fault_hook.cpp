// fault_pause: SHARDTRAIN_TEST_PAUSE's points in the loop, paused by runtime::pause_here.
#include "fault_hook.h"

#include <string>

#include "shardtrain/runtime/test_pause.h"
#include "shardtrain/train/signals.h"

namespace shardtrain::train {

void fault_pause(const char* point, int64_t step, int rank) {
  static const runtime::PauseSpec p = runtime::read_pause_spec("SHARDTRAIN_TEST_PAUSE", /*with_step=*/true);
  if (!p.at(point, step, rank)) return;
  // Until killed, or until a stop signal arrives (then the step goes on and the loop's
  // checkpoint-and-exit path runs: a signal at a known step, without timing races).
  runtime::pause_here("SHARDTRAIN_TEST_PAUSE", rank, "at " + std::string(point) + ", step " + std::to_string(step),
                      [] { return stop_signal() != 0; });
}

}  // namespace shardtrain::train
