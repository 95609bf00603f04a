// Logging to stderr (diagnostics) and stdout (rank 0's info), line-atomic.
#include "shardtrain/util/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace shardtrain::log {
namespace {
std::atomic<int> g_rank{0};
std::mutex g_mu;
Level initial_level() {
  const char* env = std::getenv("SHARDTRAIN_LOG");
  if (!env) return Level::Info;
  if (!std::strcmp(env, "debug")) return Level::Debug;
  if (!std::strcmp(env, "warn")) return Level::Warn;
  if (!std::strcmp(env, "error")) return Level::Error;
  return Level::Info;
}
std::atomic<Level> g_level{initial_level()};

void emit(FILE* f, const char* tag, const std::string& msg, bool with_rank) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (with_rank)
    std::fprintf(f, "%s[rank %d] %s\n", tag, g_rank.load(), msg.c_str());
  else
    std::fprintf(f, "%s%s\n", tag, msg.c_str());
  std::fflush(f);
}
}  // namespace

void set_rank(int rank) { g_rank.store(rank); }
void set_level(Level level) { g_level.store(level); }
Level level() { return g_level.load(); }

void info(const std::string& msg) {
  if (g_rank.load() == 0 && g_level.load() <= Level::Info) emit(stdout, "", msg, false);
}
void debug(const std::string& msg) {
  if (g_level.load() <= Level::Debug) emit(stderr, "debug: ", msg, true);
}
void warn(const std::string& msg) {
  if (g_level.load() <= Level::Warn) emit(stderr, "warning: ", msg, true);
}
void error(const std::string& msg) { emit(stderr, "error: ", msg, true); }
void all(const std::string& msg) { emit(stdout, "", msg, true); }
}  // namespace shardtrain::log
