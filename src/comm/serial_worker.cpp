// SerialWorker: a mutex/condition-variable queue drained by one thread or by waiting callers.
#include "serial_worker.h"

namespace shardtrain::comm::detail {

SerialWorker::SerialWorker() : thread_([this] { loop(); }) {}

SerialWorker::~SerialWorker() { shutdown(); }

void SerialWorker::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t SerialWorker::post(std::function<void()> task) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_id_++;
    queue_.push_back({id, std::move(task)});
  }
  cv_.notify_all();
  return id;
}

void SerialWorker::run(Task& t, std::unique_lock<std::mutex>& lock) {
  busy_ = true;
  lock.unlock();
  t.fn();
  lock.lock();
  busy_ = false;
  cv_.notify_all();
}

bool SerialWorker::run_if_next(uint64_t id) {
  std::unique_lock<std::mutex> lock(mu_);
  if (busy_ || queue_.empty() || queue_.front().id != id) return false;
  Task t = std::move(queue_.front());
  queue_.pop_front();
  run(t, lock);
  return true;
}

void SerialWorker::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return (stop_ && !busy_) || (!queue_.empty() && !busy_); });
    if (queue_.empty()) return;  // stop_, drained and nothing running
    Task t = std::move(queue_.front());
    queue_.pop_front();
    run(t, lock);
  }
}

}  // namespace shardtrain::comm::detail
