// BlockingRegion and the registry of region watchers (one per communicator handle); the
// test-only pause of SHARDTRAIN_TEST_PAUSE_IN.
#include "shardtrain/runtime/blocking_region.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <utility>
#include <vector>

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

struct TestPause {
  std::string name;
  int rank = -1;
};
TestPause parse_pause() {
  TestPause p;
  const char* env = std::getenv("SHARDTRAIN_TEST_PAUSE_IN");
  if (!env) return p;
  std::string s(env);
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos) return p;
  p.name = s.substr(0, colon);
  p.rank = std::atoi(s.substr(colon + 1).c_str());
  return p;
}

void maybe_pause(const char* name) {
  static const TestPause p = parse_pause();
  static std::atomic<bool> done{false};
  if (p.name.empty() || p.name != name || done.load()) return;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != p.rank || done.exchange(true)) return;
  const char* marker = std::getenv("SHARDTRAIN_TEST_PAUSE_MARKER");
  std::fprintf(stderr, "[rank %d] SHARDTRAIN_TEST_PAUSE_IN: pausing before region %s\n", rank, name);
  if (!marker) return;
  std::ofstream(marker) << ::getpid() << "\n";
  struct stat st {};
  for (int i = 0; i < 6000 && ::stat(marker, &st) == 0; ++i) ::usleep(100000);
  std::fprintf(stderr, "[rank %d] SHARDTRAIN_TEST_PAUSE_IN: entering region %s\n", rank, name);
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
