// SerialWorker: one thread that runs posted tasks one at a time, in the order posted.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace shardtrain::comm::detail {

class SerialWorker {
 public:
  SerialWorker();
  // Runs every task still queued, then joins: a Comm destroyed with work in flight
  // finishes it (or the watchdog ends the job) rather than dropping it.
  ~SerialWorker();
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Tasks must not throw (the comm catches and forwards errors to the Work).
  void post(std::function<void()> task);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace shardtrain::comm::detail
