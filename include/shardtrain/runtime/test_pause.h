// Test-only pauses: a rank that stops at a named point so that a test can kill it, signal it or
// cut its link there. The one implementation of both hooks: SHARDTRAIN_TEST_PAUSE (the training
// loop's points, train/fault_hook.h) and SHARDTRAIN_TEST_PAUSE_IN (blocking regions,
// blocking_region.h). Unset (always in production): one comparison per call.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace shardtrain::runtime {

// Where an environment variable says to pause: "<point>:<rank>", or with a step
// "<point>:<step>:<rank>" (the rank after the last colon, the step after the one before).
struct PauseSpec {
  std::string point;  // "" = never
  int64_t step = -1;
  int rank = -1;
  bool at(const char* p, int64_t s, int r) const { return !point.empty() && point == p && step == s && rank == r; }
};
// Reads `var` (unset or without the colons the form needs: a spec that never matches).
PauseSpec read_pause_spec(const char* var, bool with_step);

// SHARDTRAIN_TEST_PAUSE_MARKER, or nullptr when unset.
const char* pause_marker();

// Prints "[rank <rank>] <var>: pausing <where>" on stderr, writes this process's pid to the
// marker file (when SHARDTRAIN_TEST_PAUSE_MARKER is set), then sleeps in steps of 0.1 s until
// `resume()` returns true or 600 s have passed.
void pause_here(const char* var, int rank, const std::string& where, const std::function<bool()>& resume);

}  // namespace shardtrain::runtime
