// Test-only pause points, so the fault tests can kill a rank at a known place in the loop.
#pragma once
#include <cstdint>

namespace shardtrain::train {

// SHARDTRAIN_TEST_PAUSE="<point>:<step>:<rank>" makes that rank, on reaching <point> in
// step <step>, create the file SHARDTRAIN_TEST_PAUSE_MARKER (when set, holding the pid) and
// sleep up to 600 s so the test can kill it there; a stop signal (SIGUSR1/SIGTERM) ends the
// pause early and the step continues. Points: "mid_step" (after backward, before the
// optimizer step), "outer_sync" (after the optimizer step, before DiLoCo's outer step,
// Engine::sync_replicas). (A rank stalled inside a checkpoint write comes from an LD_PRELOAD
// shim in the tests instead: tests/e2e/train/write_stall.cpp.) Unset (always in production):
// one comparison per call.
void fault_pause(const char* point, int64_t step, int rank);

}  // namespace shardtrain::train
