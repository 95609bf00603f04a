// Stop requests from the batch system (SIGUSR1 before the time limit, SIGTERM before a kill).
#pragma once

namespace shardtrain::train {

// Installs handlers for SIGUSR1 and SIGTERM that only record the signal.
void install_stop_signal_handlers();
// The last stop signal received by this process (0 = none).
int stop_signal();
// Clears the record (tests).
void clear_stop_signal();

}  // namespace shardtrain::train
