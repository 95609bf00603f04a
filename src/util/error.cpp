// Error helpers: the rank recorded for messages and the internal-error thrower.
#include "shardtrain/util/error.h"

#include <atomic>

namespace shardtrain {
namespace {
std::atomic<int> g_rank{-1};
}
void set_error_rank(int rank) { g_rank.store(rank); }
int error_rank() { return g_rank.load(); }

namespace detail {
void throw_internal(const char* file, int line, const std::string& what) {
  std::ostringstream os;
  os << "[rank " << error_rank() << "] " << file << ":" << line << ": " << what;
  throw Error(os.str(), kExitInternal);
}
}  // namespace detail
}  // namespace shardtrain
