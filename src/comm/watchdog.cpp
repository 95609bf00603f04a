// Watchdog: polls every registered group, answers peers' progress queries, and on a fatal
// collective gathers peers' progress over the query communicator, prints the report and
// the flight recorder to stderr, and ends the job with MPI_Abort(kExitCommTimeout).
#include "watchdog.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "flight_recorder.h"
#include "internal.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"

namespace shardtrain::comm::detail {
namespace {

constexpr int kQueryTag = 7301;
constexpr int kReplyTag = 7302;
constexpr int kAbortFlushMs = 500;

struct Entry {
  Watched* w = nullptr;
  MPI_Comm query = MPI_COMM_NULL;
  int rank = 0, size = 1;
  std::vector<int> world_ranks;  // group rank -> MPI_COMM_WORLD rank
  std::vector<std::string> hosts;  // group rank -> host name (MPI_Get_processor_name)
};

class Watchdog {
 public:
  void add(Watched* w, MPI_Comm query) {
    Entry e;
    e.w = w;
    e.query = query;
    ST_MPI_CHECK(MPI_Comm_rank(query, &e.rank));
    ST_MPI_CHECK(MPI_Comm_size(query, &e.size));
    MPI_Group g = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    ST_MPI_CHECK(MPI_Comm_group(query, &g));
    ST_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
    std::vector<int> ranks(e.size);
    for (int i = 0; i < e.size; ++i) ranks[i] = i;
    e.world_ranks.resize(e.size);
    ST_MPI_CHECK(MPI_Group_translate_ranks(g, e.size, ranks.data(), world, e.world_ranks.data()));
    ST_MPI_CHECK(MPI_Group_free(&g));
    ST_MPI_CHECK(MPI_Group_free(&world));
    // The host of every member, for the report (a rank that never answers is named with its
    // host). Every member registers right after creating the communicator, so this collective
    // on the not yet watched query communicator meets the same call on the others.
    char name[MPI_MAX_PROCESSOR_NAME] = {0};
    int len = 0;
    ST_MPI_CHECK(MPI_Get_processor_name(name, &len));
    std::vector<char> all(static_cast<size_t>(e.size) * MPI_MAX_PROCESSOR_NAME, 0);
    ST_MPI_CHECK(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                               MPI_CHAR, query));
    for (int i = 0; i < e.size; ++i)
      e.hosts.emplace_back(&all[static_cast<size_t>(i) * MPI_MAX_PROCESSOR_NAME],
                           strnlen(&all[static_cast<size_t>(i) * MPI_MAX_PROCESSOR_NAME], MPI_MAX_PROCESSOR_NAME));

    std::lock_guard<std::mutex> life(life_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      entries_.push_back(std::move(e));
    }
    if (!thread_.joinable()) {
      stop_ = false;
      thread_ = std::thread([this] { loop(); });
    }
  }

  void remove(Watched* w) {
    std::lock_guard<std::mutex> life(life_mu_);
    bool empty;
    {
      std::lock_guard<std::mutex> lock(mu_);
      entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                    [w](const Entry& e) { return e.w == w; }),
                     entries_.end());
      empty = entries_.empty();
      if (empty) stop_ = true;
    }
    if (empty && thread_.joinable()) {
      cv_.notify_all();
      thread_.join();
    }
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      try {
        const double now = now_seconds();
        for (Entry& e : entries_) answer_queries(e);
        for (Entry& e : entries_)
          if (auto f = e.w->check(now)) fatal(e, *f);  // does not return
      } catch (const std::exception& ex) {
        // A failing watchdog must not take the job down by itself; say so once.
        if (!warned_) std::fprintf(stderr, "shardtrain watchdog [rank %d]: %s\n", error_rank(), ex.what());
        warned_ = true;
      }
      cv_.wait_for(lock, std::chrono::duration<double>(kWatchdogPollS), [this] { return stop_; });
    }
  }

  // Peers that detect a stuck collective ask every member of the group where it is.
  void answer_queries(Entry& e) {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      ST_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, e.query, &flag, &st));
      if (!flag) return;
      uint64_t asked = 0;
      ST_MPI_CHECK(MPI_Recv(&asked, 1, MPI_UINT64_T, st.MPI_SOURCE, kQueryTag, e.query,
                            MPI_STATUS_IGNORE));
      Watched::Progress p = e.w->progress();
      uint64_t reply[3] = {p.issued, p.entered, p.completed};
      // 24 bytes go eagerly: this returns at once even if the asker is about to abort.
      ST_MPI_CHECK(MPI_Send(reply, 3, MPI_UINT64_T, st.MPI_SOURCE, kReplyTag, e.query));
    }
  }

  [[noreturn]] void fatal(Entry& e, const Watched::Fatal& f) {
    // First, one line that the job scripts watch for (jobscripts/run-training.sh): it must reach
    // the launcher even when the report below is cut short by the abort. The peers' replies
    // take up to kWatchdogReplyWaitS, time enough for it to be forwarded.
    std::fputs(concat("shardtrain watchdog [rank ", error_rank(), "]: ", f.reason, " in group '", e.w->watched_name(),
                      "': aborting the job with exit code ", kExitCommTimeout, " (report follows)\n").c_str(),
               stderr);
    std::fflush(stderr);
    // Ask every other member for its progress, keep answering others while we wait.
    std::vector<uint64_t> replies(3 * e.size, 0);
    std::vector<MPI_Request> recvs(e.size, MPI_REQUEST_NULL), sends(e.size, MPI_REQUEST_NULL);
    std::vector<char> got(e.size, 0);
    uint64_t asked = f.seq;
    std::string query_error;
    try {
    for (int q = 0; q < e.size; ++q) {
      if (q == e.rank) continue;
      ST_MPI_CHECK(MPI_Irecv(&replies[3 * q], 3, MPI_UINT64_T, q, kReplyTag, e.query, &recvs[q]));
      ST_MPI_CHECK(MPI_Isend(&asked, 1, MPI_UINT64_T, q, kQueryTag, e.query, &sends[q]));
    }
    const double deadline = now_seconds() + kWatchdogReplyWaitS;
    for (;;) {
      bool all = true;
      for (int q = 0; q < e.size; ++q) {
        if (q == e.rank || got[q]) continue;
        int flag = 0;
        ST_MPI_CHECK(MPI_Test(&recvs[q], &flag, MPI_STATUS_IGNORE));
        if (flag) got[q] = 1;
        else all = false;
      }
      if (all || now_seconds() > deadline) break;
      for (Entry& other : entries_) {
        try { answer_queries(other); } catch (...) {}
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    } catch (const std::exception& ex) {
      // Still report what we know and abort: a hang is the one outcome we must avoid.
      query_error = ex.what();
    }
    Watched::Progress mine = e.w->progress();

    const double now = now_seconds();
    std::string s;
    s += concat("shardtrain watchdog [rank ", error_rank(), "]: collective ", f.reason,
                " in group '", e.w->watched_name(), "' (", e.size, " ranks): seq ", f.seq, " ",
                f.op, f.dtype == "-" && f.numel == 0 ? std::string() : concat(" of ", f.numel, " ", f.dtype, " elements"),
                ", outstanding for ", f.running_s, " s\n");
    if (!query_error.empty()) s += concat("  (querying peers failed: ", query_error, ")\n");
    std::vector<std::string> missing, silent, where;
    for (int q = 0; q < e.size; ++q) {
      Watched::Progress p = mine;
      if (q != e.rank) p = {replies[3 * q], replies[3 * q + 1], replies[3 * q + 2]};
      std::string who = concat("group rank ", q, " (world rank ", e.world_ranks[q], ")");
      if (q != e.rank && !got[q]) {
        s += concat("  ", who, ": NOT RESPONDING (no reply within ", kWatchdogReplyWaitS, " s)\n");
        silent.push_back(concat(q, " (world ", e.world_ranks[q], ")"));
        where.push_back(concat("world rank ", e.world_ranks[q], " on ", e.hosts[q]));
      } else if (p.entered >= f.seq) {
        s += concat("  ", who, ": arrived (entered seq ", p.entered, ", issued ", p.issued,
                    ", completed ", p.completed, ")\n");
      } else {
        s += concat("  ", who, ": NOT ARRIVED at seq ", f.seq, ": entered seq ", p.entered,
                    ", issued ", p.issued, ", completed ", p.completed, "\n");
        missing.push_back(concat(q, " (world ", e.world_ranks[q], ") at seq ", p.entered));
        where.push_back(concat("world rank ", e.world_ranks[q], " on ", e.hosts[q]));
      }
    }
    auto join = [](const std::vector<std::string>& v) {
      std::string r;
      for (size_t i = 0; i < v.size(); ++i) r += (i ? ", " : "") + v[i];
      return r.empty() ? std::string("none") : r;
    };
    s += concat("  ranks of '", e.w->watched_name(), "' not arrived at seq ", f.seq, ": ",
                join(missing), "; not responding: ", join(silent), "\n");
    if (!where.empty()) s += concat("  hosts of those ranks: ", join(where), "\n");
    if (missing.empty() && silent.empty())
      s += "  every rank entered the collective: it is stuck inside the backend (network, "
           "mismatched sizes or ops?)\n";
    auto records = e.w->watched_records();
    s += concat("  flight recorder of '", e.w->watched_name(), "' on rank ", error_rank(), " (last ",
                records.size(), " collectives, times relative to now):\n");
    s += format_flight_records(records, now, "    ");
    s += concat("  aborting all ranks with exit code ", kExitCommTimeout, "\n");
    std::fputs(s.c_str(), stderr);
    std::fflush(stderr);
    std::fflush(stdout);
    // Let mpirun's output forwarding take the report before MPI_Abort ends the ranks (measured
    // on the test cluster: without it the report's last lines can be lost).
    std::this_thread::sleep_for(std::chrono::milliseconds(kAbortFlushMs));
    for (Entry& other : entries_) other.w->abort_backend();
    MPI_Abort(MPI_COMM_WORLD, kExitCommTimeout);
    std::_Exit(kExitCommTimeout);
  }

  std::mutex life_mu_;  // serialises add/remove (thread start and join)
  std::mutex mu_;       // guards entries_ and stop_; held by the loop while polling
  std::condition_variable cv_;
  std::vector<Entry> entries_;
  bool stop_ = false;
  bool warned_ = false;
  std::thread thread_;
};

// Never destroyed: a static destructor would run after MPI_Finalize.
Watchdog& instance() {
  static Watchdog* w = new Watchdog;
  return *w;
}

}  // namespace

void watchdog_add(Watched* w, MPI_Comm query_comm) { instance().add(w, query_comm); }
void watchdog_remove(Watched* w) { instance().remove(w); }

}  // namespace shardtrain::comm::detail
