// Wall-clock timing helpers (steady clock).
#pragma once
#include <chrono>

namespace shardtrain {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Timer {
 public:
  Timer() : start_(now_seconds()) {}
  void reset() { start_ = now_seconds(); }
  double seconds() const { return now_seconds() - start_; }
  double ms() const { return 1e3 * seconds(); }

 private:
  double start_;
};

}  // namespace shardtrain
