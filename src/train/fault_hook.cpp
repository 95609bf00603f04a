// fault_pause: reads SHARDTRAIN_TEST_PAUSE once; sleeps where it says (tests kill the process there).
#include "fault_hook.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "shardtrain/train/signals.h"

namespace shardtrain::train {
namespace {
struct PausePoint {
  std::string point;
  int64_t step = -1;
  int rank = -1;
};
PausePoint parse() {
  PausePoint p;
  const char* env = std::getenv("SHARDTRAIN_TEST_PAUSE");
  if (!env) return p;
  std::string s(env);
  size_t a = s.find(':'), b = s.rfind(':');
  if (a == std::string::npos || a == b) return p;
  p.point = s.substr(0, a);
  p.step = std::atoll(s.substr(a + 1, b - a - 1).c_str());
  p.rank = std::atoi(s.substr(b + 1).c_str());
  return p;
}
}  // namespace

void fault_pause(const char* point, int64_t step, int rank) {
  static const PausePoint p = parse();
  if (p.step != step || p.rank != rank || p.point != point) return;
  std::fprintf(stderr, "[rank %d] SHARDTRAIN_TEST_PAUSE: pausing at %s, step %lld\n", rank, point,
               static_cast<long long>(step));
  if (const char* marker = std::getenv("SHARDTRAIN_TEST_PAUSE_MARKER")) std::ofstream(marker) << ::getpid() << "\n";
  // Until killed, or until a stop signal arrives (then the step goes on and the loop's
  // checkpoint-and-exit path runs: a signal at a known step, without timing races).
  for (int i = 0; i < 6000 && stop_signal() == 0; ++i) ::usleep(100000);
}

}  // namespace shardtrain::train
