// CountingAllocator: wraps c10's CPU allocator; a pointer -> size map gives the frees.
#include "shardtrain/train/alloc_tracker.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "shardtrain/util/error.h"

namespace shardtrain::train {
namespace {

std::atomic<int64_t> g_live{0}, g_peak{0}, g_allocs{0}, g_limit{0};
std::atomic<bool> g_exceeded{false};

// The wrapped allocator's deleter. The DefaultCPUAllocator returns DataPtrs whose context is
// the data pointer and whose deleter is its raw_deleter(), so one function frees them all.
c10::DeleterFnPtr g_inner_deleter = nullptr;
c10::Allocator* g_inner = nullptr;

std::mutex& sizes_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<void*, size_t>& sizes() {
  static auto* m = new std::unordered_map<void*, size_t>();  // never destroyed: frees can come late
  return *m;
}

void note_alloc(int64_t n) {
  const int64_t live = g_live.fetch_add(n) + n;
  int64_t peak = g_peak.load();
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
  }
  const int64_t limit = g_limit.load();
  if (limit > 0 && live > limit) g_exceeded.store(true);
  g_allocs.fetch_add(1);
}

void counting_delete(void* ptr) {
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(sizes_mutex());
    auto it = sizes().find(ptr);
    if (it != sizes().end()) {
      n = it->second;
      sizes().erase(it);
    }
  }
  g_live.fetch_sub(static_cast<int64_t>(n));
  g_inner_deleter(ptr);
}

struct CountingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) const override {
    c10::DataPtr inner = g_inner->allocate(n);
    void* p = inner.get();
    if (p == nullptr) return inner;  // 0 bytes: nothing to count
    ST_CHECK(inner.get_context() == p && inner.get_deleter() == g_inner_deleter,
             "the CPU allocator returned a DataPtr the counting allocator cannot wrap");
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(sizes_mutex());
      sizes()[p] = n;
    }
    note_alloc(static_cast<int64_t>(n));
    return {p, p, &counting_delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counting_delete; }
};

std::once_flag g_once;
CountingAllocator g_counting;

}  // namespace

void install_alloc_tracker() {
  std::call_once(g_once, [] {
    g_inner = c10::GetCPUAllocator();
    g_inner_deleter = g_inner->raw_deleter();
    ST_CHECK(g_inner_deleter != nullptr, "the CPU allocator has no raw deleter; cannot count its allocations");
    // Priority above the default allocator's registration (0).
    c10::SetCPUAllocator(&g_counting, /*priority=*/1);
  });
}

bool alloc_tracker_installed() { return g_inner != nullptr; }

AllocCounters alloc_counters() {
  AllocCounters c;
  c.live_bytes = g_live.load();
  c.peak_bytes = g_peak.load();
  c.allocations = g_allocs.load();
  return c;
}

void reset_alloc_peak() { g_peak.store(g_live.load()); }

void set_alloc_limit(int64_t bytes) {
  g_limit.store(bytes);
  g_exceeded.store(false);
}

bool alloc_limit_exceeded() { return g_exceeded.load(); }

}  // namespace shardtrain::train
