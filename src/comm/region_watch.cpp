// watch_regions: a communicator's blocking regions as a Watched group of the watchdog. Each
// region entered is one "sequence number" (every rank enters the same regions in the same
// order), so the watchdog's report says which ranks have not reached the stuck region.
#include <atomic>
#include <mutex>
#include <optional>
#include <vector>

#include "flight_recorder.h"
#include "internal.h"
#include "shardtrain/comm/watch_regions.h"
#include "shardtrain/runtime/blocking_region.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"
#include "watchdog.h"

namespace shardtrain::comm {
namespace {

using namespace detail;

// Timeouts of the watched communicators, for watch_regions_like.
std::mutex& timeouts_mu() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<std::pair<MPI_Comm, double>>& timeouts() {
  static auto* v = new std::vector<std::pair<MPI_Comm, double>>;
  return *v;
}

constexpr int kRegionRecords = 32;

class RegionWatchImpl final : public RegionWatch, public Watched, public runtime::RegionWatcher {
 public:
  RegionWatchImpl(MPI_Comm comm, std::string name, double timeout_s)
      : comm_(comm), name_(std::move(name)), timeout_s_(timeout_s), recorder_(kRegionRecords) {
    ST_MPI_CHECK(MPI_Comm_dup(comm, &query_));
    ST_MPI_CHECK(MPI_Comm_set_errhandler(query_, MPI_ERRORS_RETURN));
    watchdog_add(this, query_);
    runtime::set_region_watcher(comm_, this);
    std::lock_guard<std::mutex> lock(timeouts_mu());
    timeouts().emplace_back(comm_, timeout_s_);
  }

  ~RegionWatchImpl() override {
    {
      std::lock_guard<std::mutex> lock(timeouts_mu());
      auto& t = timeouts();
      for (size_t i = 0; i < t.size(); ++i)
        if (t[i].first == comm_) {
          t.erase(t.begin() + static_cast<long>(i));
          break;
        }
    }
    runtime::clear_region_watcher(comm_, this);
    watchdog_remove(this);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&query_);
  }

  // runtime::RegionWatcher
  void enter(const char* name) override {
    const double t = now_seconds();
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t seq = entered_.load() + 1;
    std::string op = std::string("region ") + name;
    recorder_.issued(seq, op, 0, "-", t);
    recorder_.started(seq, t);
    open_.push_back({seq, std::move(op), t});
    entered_.store(seq);
  }
  void leave() override {
    const double t = now_seconds();
    std::lock_guard<std::mutex> lock(mu_);
    if (open_.empty()) return;
    recorder_.finished(open_.back().seq, t);
    open_.pop_back();
    completed_.fetch_add(1);
  }

  // Watched
  Progress progress() override {
    const uint64_t e = entered_.load();
    return {e, e, completed_.load()};
  }
  std::optional<Fatal> check(double now) override {
    std::lock_guard<std::mutex> lock(mu_);  // also guards timeout_s_ (set_timeout)
    if (timeout_s_ <= 0) return std::nullopt;
    if (open_.empty()) return std::nullopt;
    const Open& o = open_.back();  // the innermost region: the one blocking now
    if (now - o.since < timeout_s_) return std::nullopt;
    Fatal f;
    f.seq = o.seq;
    f.op = o.op;
    f.dtype = "-";
    f.running_s = now - o.since;
    f.reason = concat("timed out (timeout_s = ", timeout_s_, ")");
    return f;
  }
  std::string watched_name() const override { return name_; }
  std::vector<FlightRecord> watched_records() const override { return recorder_.snapshot(); }

  double timeout_s() const { return timeout_s_; }

  void set_timeout(double timeout_s) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      timeout_s_ = timeout_s;
    }
    std::lock_guard<std::mutex> lock(timeouts_mu());
    for (auto& [c, t] : timeouts())
      if (c == comm_) t = timeout_s;
  }

 private:
  struct Open {
    uint64_t seq;
    std::string op;
    double since;
  };
  MPI_Comm comm_, query_ = MPI_COMM_NULL;
  std::string name_;
  double timeout_s_;
  FlightRecorder recorder_;
  std::mutex mu_;
  std::vector<Open> open_;
  std::atomic<uint64_t> entered_{0}, completed_{0};
};

}  // namespace

std::unique_ptr<RegionWatch> watch_regions(MPI_Comm comm, const std::string& name, double timeout_s) {
  return std::make_unique<RegionWatchImpl>(comm, name, timeout_s);
}

std::unique_ptr<RegionWatch> watch_regions_like(MPI_Comm comm, const std::string& name, MPI_Comm like) {
  std::optional<double> timeout;
  {
    std::lock_guard<std::mutex> lock(timeouts_mu());
    for (auto& [c, t] : timeouts())
      if (c == like) timeout = t;
  }
  if (!timeout) return nullptr;
  return watch_regions(comm, name, *timeout);
}

}  // namespace shardtrain::comm
