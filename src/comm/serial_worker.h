// SerialWorker: one thread that runs posted tasks one at a time, in the order posted; a
// waiting caller may run the next task itself instead of waking the thread.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace shardtrain::comm::detail {

class SerialWorker {
 public:
  SerialWorker();
  ~SerialWorker();  // shutdown()
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Tasks must not throw (the comm catches and forwards errors to the Work). Returns the
  // task's id (1, 2, ...).
  uint64_t post(std::function<void()> task);

  // Runs task `id` on the calling thread if it is next in line and no task is running.
  // Why: a caller about to block in Work::wait() would otherwise pay two thread
  // wake-ups per collective, which on an oversubscribed node can cost a scheduler time
  // slice each. Order and exclusivity are kept: at most one task runs at a time, in
  // posting order. Returns false when the task is not next (or already ran).
  bool run_if_next(uint64_t id);

  // Runs every task still queued, then joins the thread: a Comm destroyed with work in
  // flight finishes it (or the watchdog ends the job) rather than dropping it. Idempotent.
  void shutdown();

 private:
  struct Task {
    uint64_t id;
    std::function<void()> fn;
  };
  void loop();
  void run(Task& t, std::unique_lock<std::mutex>& lock);  // with mu_ held on entry and exit

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  uint64_t next_id_ = 1;
  bool busy_ = false;  // a task is running (on the worker or on a caller)
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace shardtrain::comm::detail
