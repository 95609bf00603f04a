// Async-signal-safe stop flag: the handler stores the signal number, the loop polls it.
#include "shardtrain/train/signals.h"

#include <csignal>

namespace shardtrain::train {
namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int sig) { g_signal = sig; }
}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}
int stop_signal() { return g_signal; }
void clear_stop_signal() { g_signal = 0; }

}  // namespace shardtrain::train
