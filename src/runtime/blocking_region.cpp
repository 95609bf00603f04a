// BlockingRegion and the registry of region watchers (one per communicator handle); the
// test-only pause of SHARDTRAIN_TEST_PAUSE_IN.
#include "shardtrain/runtime/blocking_region.h"

#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/runtime/test_pause.h"

namespace shardtrain::runtime {
namespace {

std::mutex& registry_mu() {
  static std::mutex* m = new std::mutex;  // never destroyed: regions may end after static destruction starts
  return *m;
}
std::vector<std::pair<MPI_Comm, RegionWatcher*>>& registry() {
  static auto* r = new std::vector<std::pair<MPI_Comm, RegionWatcher*>>;
  return *r;
}

RegionWatcher* find(MPI_Comm comm) {
  std::lock_guard<std::mutex> lock(registry_mu());
  for (auto& [c, w] : registry())
    if (c == comm) return w;
  return nullptr;
}

// SHARDTRAIN_TEST_PAUSE_IN (blocking_region.h): the first time only; without a marker file
// the rank says so and goes on, with one it waits until the test removes the file.
void maybe_pause(const char* name) {
  static const PauseSpec p = read_pause_spec("SHARDTRAIN_TEST_PAUSE_IN", /*with_step=*/false);
  static std::atomic<bool> done{false};
  if (p.point.empty() || p.point != name || done.load()) return;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (!p.at(name, -1, rank) || done.exchange(true)) return;
  const char* marker = pause_marker();
  pause_here("SHARDTRAIN_TEST_PAUSE_IN", rank, std::string("before region ") + name, [marker] {
    struct stat st {};
    return !marker || ::stat(marker, &st) != 0;
  });
  if (marker) std::fprintf(stderr, "[rank %d] SHARDTRAIN_TEST_PAUSE_IN: entering region %s\n", rank, name);
}

}  // namespace

void set_region_watcher(MPI_Comm comm, RegionWatcher* w) {
  std::lock_guard<std::mutex> lock(registry_mu());
  for (auto& [c, old] : registry())
    if (c == comm) {
      old = w;
      return;
    }
  registry().emplace_back(comm, w);
}

void clear_region_watcher(MPI_Comm comm, RegionWatcher* w) {
  std::lock_guard<std::mutex> lock(registry_mu());
  auto& r = registry();
  for (size_t i = 0; i < r.size(); ++i)
    if (r[i].first == comm && r[i].second == w) {
      r.erase(r.begin() + static_cast<long>(i));
      return;
    }
}

BlockingRegion::BlockingRegion(MPI_Comm comm, const char* name) {
  maybe_pause(name);
  watcher_ = find(comm);
  if (watcher_) watcher_->enter(name);
}

BlockingRegion::~BlockingRegion() {
  if (watcher_) watcher_->leave();
}

}  // namespace shardtrain::runtime
