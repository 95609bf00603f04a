// Logging: rank 0 prints by default; every line can say which rank wrote it.
#pragma once
#include <string>

#include "shardtrain/util/error.h"

namespace shardtrain::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3 };

void set_rank(int rank);              // called by the runtime after MPI_Init
void set_level(Level level);          // SHARDTRAIN_LOG=debug|info|warn|error also sets it
Level level();

// Rank 0 only (info/debug); warnings and errors from any rank, prefixed with the rank.
void info(const std::string& msg);
void debug(const std::string& msg);
void warn(const std::string& msg);
void error(const std::string& msg);
// Every rank prints, prefixed with its rank.
void all(const std::string& msg);

template <typename... Args>
std::string fmt(Args&&... args) { return ::shardtrain::detail::concat(std::forward<Args>(args)...); }

}  // namespace shardtrain::log
