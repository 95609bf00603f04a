// `shardtrain bench collectives` (comm::run_collectives_bench): the rows it reports, with the
// ranks split into groups that run at once (--group-size, --strided: how perf/cluster/run.sh
// measures the intra-node edge and the replicate pairs), and with compute beside it
// (--compute-ms: sync_us, core_us). Times are not checked (tests never check wall time); what is
// checked is what the planner's inputs are read from: sizes and bus factors of the group's rank
// count, one row per op that is the same on every rank (the slowest group's), the table on
// rank 0 only, and a group size that does not divide the ranks refused on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "comm_test_util.h"
#include "shardtrain/comm/bench.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;
using namespace shardtrain::comm;
using namespace shardtrain::comm::testing;

namespace {

// true on every rank iff v is the same on every rank.
bool same_on_every_rank(double v) {
  double lo = 0, hi = 0;
  MPI_Allreduce(&v, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&v, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

CollectivesBenchOptions small_run(int group_size, bool strided) {
  CollectivesBenchOptions o;
  o.op = "all";
  o.min_bytes = o.max_bytes = 4096;
  o.iters = 3;
  o.warmup = 1;
  o.group_size = group_size;
  o.group_strided = strided;
  return o;
}

void check_rows(const std::vector<CollectivesBenchRow>& rows, int g) {
  ASSERT_EQ(rows.size(), 3u);
  const char* ops[] = {"all_gather", "reduce_scatter", "all_reduce"};
  for (size_t i = 0; i < rows.size(); ++i) {
    const CollectivesBenchRow& r = rows[i];
    SCOPED_TRACE(r.op);
    EXPECT_EQ(r.op, ops[i]);
    const bool ar = r.op == "all_reduce";
    // Whole fp32 elements per rank of the group (all_gather/reduce_scatter: size = g x per rank).
    const int64_t count = ar ? 4096 / 4 : 4096 / (4 * g) * g;
    EXPECT_EQ(r.count, count);
    EXPECT_EQ(r.bytes, count * 4);
    // The bus factor of the group's ring, not the world's.
    const double factor = ar ? 2.0 * (g - 1) / g : double(g - 1) / g;
    EXPECT_EQ(r.busbw, r.algbw * factor);
    EXPECT_GT(r.time_us, 0);
    EXPECT_GT(r.raw_time_us, 0);
    // Every rank reports the slowest group's row (a group-local maximum would differ).
    EXPECT_TRUE(same_on_every_rank(r.time_us));
    EXPECT_TRUE(same_on_every_rank(r.raw_time_us));
  }
}

}  // namespace

TEST(BenchCollectives, WholeWorldByDefault) {
  std::ostringstream out;
  auto rows = run_collectives_bench(MPI_COMM_WORLD, small_run(0, false), out);
  check_rows(rows, world_size());
  if (world_rank() == 0) {
    EXPECT_NE(out.str().find(std::to_string(world_size()) + " ranks, dtype float32"), std::string::npos) << out.str();
    EXPECT_EQ(out.str().find("groups of"), std::string::npos);
    EXPECT_EQ(out.str().find("core_us"), std::string::npos);  // only with compute beside it
  } else {
    EXPECT_EQ(out.str(), "");
  }
}

TEST(BenchCollectives, GroupsOfEveryDivisorRunAtOnceContiguousAndStrided) {
  const int n = world_size();
  for (int g = 1; g <= n; ++g) {
    if (n % g) continue;
    for (bool strided : {false, true}) {
      SCOPED_TRACE("group size " + std::to_string(g) + (strided ? " strided" : " contiguous"));
      std::ostringstream out;
      auto rows = run_collectives_bench(MPI_COMM_WORLD, small_run(g, strided), out);
      check_rows(rows, g);
      if (world_rank() == 0) {
        const std::string s = out.str();
        EXPECT_NE(s.find("collectives: " + std::to_string(g) + " ranks, dtype"), std::string::npos) << s;
        if (g < n) {
          const std::string head = "# " + std::to_string(n / g) + " groups of " + std::to_string(g) +
                                   " ranks at once (" + (strided ? "strided" : "contiguous") + ")";
          EXPECT_NE(s.find(head), std::string::npos) << s;
        }
      }
    }
  }
}

TEST(BenchCollectives, ComputeBesideGivesSyncAndCoreColumns) {
  CollectivesBenchOptions o = small_run(0, false);
  o.op = "reduce_scatter";
  o.compute_ms = 1;
  o.iters = 2;
  std::ostringstream out;
  auto rows = run_collectives_bench(MPI_COMM_WORLD, o, out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_TRUE(std::isfinite(rows[0].sync_us));
  EXPECT_TRUE(std::isfinite(rows[0].core_us));
  EXPECT_TRUE(same_on_every_rank(rows[0].sync_us));
  EXPECT_TRUE(same_on_every_rank(rows[0].core_us));
  if (world_rank() == 0) {
    EXPECT_NE(out.str().find("sync_us    core_us"), std::string::npos) << out.str();
  }
}

TEST(BenchCollectives, AGroupSizeThatDoesNotDivideTheRanksIsRefusedOnEveryRank) {
  const int n = world_size();
  for (int g : {n + 1, -1}) {
    std::ostringstream out;
    try {
      run_collectives_bench(MPI_COMM_WORLD, small_run(g, false), out);
      ADD_FAILURE() << "group size " << g << " at " << n << " ranks was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("--group-size " + std::to_string(g) + " must divide the " +
                                           std::to_string(n) + " ranks"),
                std::string::npos)
          << e.what();
    }
  }
  // Nothing was left half-done: the world still runs collectives together.
  int one = 1, sum = 0;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(sum, n);
}
