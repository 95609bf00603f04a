// The test-only pause (see test_pause.h): the spec's parse, the marker file and the wait.
#include "shardtrain/runtime/test_pause.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace shardtrain::runtime {

PauseSpec read_pause_spec(const char* var, bool with_step) {
  PauseSpec p;
  const char* env = std::getenv(var);
  if (!env) return p;
  const std::string s(env);
  const size_t last = s.rfind(':');
  if (last == std::string::npos || last == 0) return p;
  size_t end = last;  // where the point ends
  if (with_step) {
    end = s.rfind(':', last - 1);
    if (end == std::string::npos) return p;
    p.step = std::atoll(s.substr(end + 1, last - end - 1).c_str());
  }
  p.point = s.substr(0, end);
  p.rank = std::atoi(s.substr(last + 1).c_str());
  return p;
}

const char* pause_marker() { return std::getenv("SHARDTRAIN_TEST_PAUSE_MARKER"); }

void pause_here(const char* var, int rank, const std::string& where, const std::function<bool()>& resume) {
  std::fprintf(stderr, "[rank %d] %s: pausing %s\n", rank, var, where.c_str());
  if (const char* marker = pause_marker()) std::ofstream(marker) << ::getpid() << "\n";
  for (int i = 0; i < 6000 && !resume(); ++i) ::usleep(100000);
}

}  // namespace shardtrain::runtime
