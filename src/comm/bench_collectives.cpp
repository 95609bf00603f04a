// Collectives benchmark: our MPI-backend Comm vs the raw MPI call, nccl-tests columns.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <ostream>

#include "internal.h"
#include "mpi_types.h"
#include "shardtrain/comm/bench.h"
#include "shardtrain/comm/comm.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"

namespace shardtrain::comm {
namespace {

using detail::concat;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Seconds of one call, the slowest rank's (all ranks start after a barrier).
double timed(MPI_Comm comm, const std::function<void()>& fn) {
  ST_MPI_CHECK(MPI_Barrier(comm));
  const double t0 = now_seconds();
  fn();
  double dt = now_seconds() - t0, worst = 0;
  ST_MPI_CHECK(MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, comm));
  return worst;
}

// One rank's matmul work of about `ms` milliseconds (calibrated on this rank, with every rank
// calibrating at once, so under the same sharing of cores as the timed loops).
struct Work {
  at::Tensor a;
  mutable at::Tensor b;  // the product, overwritten
  int reps = 1;
  void run() const {
    for (int i = 0; i < reps; ++i) at::mm_out(b, a, a);
  }
};
Work make_work(MPI_Comm comm, double ms) {
  Work w;
  w.a = at::randn({128, 128});
  w.b = at::empty({128, 128});
  w.run();
  ST_MPI_CHECK(MPI_Barrier(comm));
  const double t0 = now_seconds();
  const int probe = 200;
  for (int i = 0; i < probe; ++i) at::mm_out(w.b, w.a, w.a);
  const double per = (now_seconds() - t0) / probe;
  double worst = 0;
  ST_MPI_CHECK(MPI_Allreduce(&per, &worst, 1, MPI_DOUBLE, MPI_MAX, comm));
  w.reps = std::max(1, static_cast<int>(ms * 1e-3 / worst));
  return w;
}

// Seconds per iteration of (work, then fn) minus the same without fn, minus fn's time issued in
// step (a barrier before it): the cost of arriving out of phase. The ranks drift out of phase over
// a run of iterations without a barrier, so each sample is a run of `iters` of them; runs with
// and without fn alternate, kSyncRuns of each, and the result is the median of the pairs'
// differences, so that one slow spell of the shared cores does not decide it.
constexpr int kSyncRuns = 5;
double sync_seconds(MPI_Comm comm, const std::function<void()>& fn, double ms, int iters) {
  const Work w = make_work(comm, ms);
  auto loop = [&](bool with_fn) {
    ST_MPI_CHECK(MPI_Barrier(comm));
    const double t0 = now_seconds();
    for (int i = 0; i < iters; ++i) {
      w.run();
      if (with_fn) fn();
    }
    double dt = now_seconds() - t0, worst = 0;
    ST_MPI_CHECK(MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, comm));
    return worst / iters;
  };
  std::vector<double> in_step;
  for (int i = 0; i < iters; ++i) in_step.push_back(timed(comm, fn));
  loop(true);  // warm-up
  std::vector<double> diffs;
  for (int r = 0; r < kSyncRuns; ++r) {
    const double both = loop(true);
    diffs.push_back(both - loop(false));
  }
  return median(diffs) - median(in_step);
}

// Median seconds of (issue the collective, `ms` of matmuls meanwhile, wait) minus the median of
// the matmuls alone, iterations of both interleaved and each started in step (a barrier): what
// the collective adds to compute running beside it. With cores to spare that is max(0, its time
// - ms): its wire time hides. On cores its ranks share it is its core time (the copies, the
// reductions, the TCP stack, polling), which cannot hide; `ms` should exceed its time.
double overlap_seconds(MPI_Comm comm, const std::function<WorkPtr()>& issue, double ms, int iters) {
  const Work w = make_work(comm, ms);
  auto both = [&] {
    WorkPtr h = issue();
    w.run();
    h->wait();
  };
  auto alone = [&] { w.run(); };
  timed(comm, both);  // warm-up
  std::vector<double> t_both, t_alone;
  for (int i = 0; i < iters; ++i) {
    t_both.push_back(timed(comm, both));
    t_alone.push_back(timed(comm, alone));
  }
  return median(t_both) - median(t_alone);
}

}  // namespace

at::ScalarType parse_float_dtype(const std::string& t) {
  const std::optional<at::ScalarType> d = dtype_from_name(t, /*with_alias=*/true);
  if (d && at::isFloatingType(*d)) return *d;
  const std::vector<std::string> names = float_dtype_short_names();
  std::string expected;
  for (size_t i = 0; i < names.size(); ++i)
    expected += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  throw UserError("unknown dtype '" + t + "': expected " + expected);
}

std::vector<CollectivesBenchRow> run_collectives_bench(MPI_Comm comm,
                                                       const CollectivesBenchOptions& o,
                                                       std::ostream& out) {
  const at::ScalarType dtype = parse_float_dtype(o.dtype);
  std::vector<std::string> ops;
  if (o.op == "all") ops = {"all_gather", "reduce_scatter", "all_reduce"};
  else ops = {o.op};
  for (auto& op : ops)
    ST_USER_CHECK(op == "all_gather" || op == "reduce_scatter" || op == "all_reduce",
                  "unknown --op '", op, "': expected all_gather, reduce_scatter, all_reduce or all");
  ST_USER_CHECK(o.min_bytes > 0 && o.min_bytes <= o.max_bytes, "need 0 < --min-bytes <= --max-bytes");
  ST_USER_CHECK(o.iters >= 1 && o.warmup >= 0, "need --iters >= 1 and --warmup >= 0");

  int rank = 0, world_n = 1;
  ST_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  ST_MPI_CHECK(MPI_Comm_size(comm, &world_n));
  ST_USER_CHECK(o.group_size >= 0 && (o.group_size == 0 || world_n % o.group_size == 0), "--group-size ",
                o.group_size, " must divide the ", world_n, " ranks");
  // The groups, each running the benchmark at the same time as the others (the traffic pattern
  // of a mesh dimension: contiguous = shard groups inside hosts, strided = replicate groups).
  const int g = o.group_size > 0 ? o.group_size : world_n;
  const int color = o.group_strided ? rank % (world_n / g) : rank / g;
  MPI_Comm group = MPI_COMM_NULL;
  ST_MPI_CHECK(MPI_Comm_split(comm, color, rank, &group));
  const int n = g;
  MPI_Comm raw = MPI_COMM_NULL;
  ST_MPI_CHECK(MPI_Comm_dup(group, &raw));
  CommOptions copts;
  copts.timeout_s = 600;
  auto ours = make_mpi_comm(group, "bench", copts);
  // A row's times: the slowest group's.
  auto slowest = [&](double v) {
    double worst = v;
    ST_MPI_CHECK(MPI_Allreduce(&v, &worst, 1, MPI_DOUBLE, MPI_MAX, comm));
    return worst;
  };
  const int64_t esize = c10::elementSize(dtype);
  const MPI_Datatype mt = detail::mpi_datatype(dtype);
  const bool half = dtype == at::kBFloat16 || dtype == at::kHalf;
  const MPI_Op sum = half ? detail::half_mpi_op(dtype, ReduceOp::Sum) : MPI_SUM;
  const std::string tname = dtype_long_name(dtype);

  std::vector<CollectivesBenchRow> rows;
  char line[320];
  if (rank == 0) {
    if (g != world_n)
      out << "# " << world_n / g << " groups of " << g << " ranks at once (" << (o.group_strided ? "strided" : "contiguous")
          << "); each row: the slowest group's times\n";
    out << "# shardtrain bench collectives: " << n << " ranks, dtype " << tname << ", backend mpi, "
        << o.iters << " iters (median over iterations of the slowest rank), warmup " << o.warmup << "\n"
        << "# size = total bytes: n x per-rank bytes for all_gather/reduce_scatter (as nccl-tests), "
           "the buffer for all_reduce\n"
        << "# algbw = size/time (GB/s = 1e9 B/s); busbw = algbw * (n-1)/n for all_gather and "
           "reduce_scatter, * 2(n-1)/n for all_reduce\n"
        << "# raw = the plain MPI call on the same buffers (MPI_Allgather, MPI_Reduce_scatter_block, "
           "MPI_Allreduce; half types use a user MPI_Op)\n"
        << "# efficiency = raw time / our time (= our busbw / raw busbw)\n";
    if (o.compute_ms > 0)
      out << "# sync_us = per iteration of (" << o.compute_ms << " ms of matmuls on every rank, then our collective, no "
             "barrier) minus the matmuls alone minus time_us: the collective's cost beyond time_us when ranks arrive "
             "from computing\n"
          << "# core_us = per iteration of (our collective issued, max(" << o.compute_ms << " ms, 2 x time_us) of "
             "matmuls meanwhile, then waited) minus the matmuls alone: what it adds to compute beside it (its core "
             "time; wire time hides)\n";
    std::snprintf(line, sizeof line, "%-15s %12s %12s %-9s %10s %9s %9s %10s %9s %10s%s\n", "# op",
                  "size(B)", "count(el)", "type", "time_us", "algbw", "busbw", "raw_us",
                  "raw_busbw", "efficiency", o.compute_ms > 0 ? "    sync_us    core_us" : "");
    out << line << std::flush;
  }
  for (const std::string& op : ops) {
    const double factor = op == "all_reduce" ? 2.0 * (n - 1) / n : double(n - 1) / n;
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
      // Whole elements per rank; all_reduce needs only whole elements.
      int64_t per_rank = op == "all_reduce" ? bytes / esize : bytes / (esize * n);
      if (per_rank == 0) continue;
      const int64_t count = op == "all_reduce" ? per_rank : per_rank * n;
      auto opts = at::TensorOptions().dtype(dtype);
      at::Tensor big = at::zeros({count}, opts);                       // gathered / input of RS
      at::Tensor small = at::zeros({op == "all_reduce" ? 0 : per_rank}, opts);
      std::function<void()> mine, plain;
      std::function<WorkPtr()> issue;
      const int c = static_cast<int>(per_rank);
      if (op == "all_gather") {
        issue = [&] { return ours->all_gather(big, small); };
        plain = [&] {
          ST_MPI_CHECK(MPI_Allgather(small.data_ptr(), c, mt, big.data_ptr(), c, mt, raw));
        };
      } else if (op == "reduce_scatter") {
        issue = [&] { return ours->reduce_scatter(small, big, ReduceOp::Sum); };
        plain = [&] {
          ST_MPI_CHECK(MPI_Reduce_scatter_block(big.data_ptr(), small.data_ptr(), c, mt, sum, raw));
        };
      } else {
        issue = [&] { return ours->all_reduce(big, ReduceOp::Sum); };
        plain = [&] {
          ST_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, big.data_ptr(), c, mt, sum, raw));
        };
      }
      mine = [&] { issue()->wait(); };
      for (int i = 0; i < o.warmup; ++i) {
        timed(group, mine);
        timed(group, plain);
      }
      std::vector<double> t_ours, t_raw;
      for (int i = 0; i < o.iters; ++i) {
        t_ours.push_back(timed(group, mine));
        t_raw.push_back(timed(group, plain));
      }
      CollectivesBenchRow r;
      r.op = op;
      r.bytes = count * esize;
      r.count = count;
      r.time_us = 1e6 * slowest(median(t_ours));
      r.raw_time_us = 1e6 * slowest(median(t_raw));
      r.algbw = r.bytes / (r.time_us * 1e3);
      r.busbw = r.algbw * factor;
      r.raw_busbw = r.bytes / (r.raw_time_us * 1e3) * factor;
      r.efficiency = r.raw_time_us / r.time_us;
      if (o.compute_ms > 0) {
        r.sync_us = 1e6 * slowest(sync_seconds(group, mine, o.compute_ms, o.iters));
        r.core_us = 1e6 * slowest(overlap_seconds(group, issue, std::max(o.compute_ms, 2e-3 * r.time_us), o.iters));
      }
      rows.push_back(r);
      if (rank == 0) {
        std::snprintf(line, sizeof line,
                      "%-15s %12lld %12lld %-9s %10.1f %9.3f %9.3f %10.1f %9.3f %10.3f",
                      op.c_str(), static_cast<long long>(r.bytes), static_cast<long long>(r.count),
                      tname.c_str(), r.time_us, r.algbw, r.busbw, r.raw_time_us, r.raw_busbw,
                      r.efficiency);
        out << line;
        if (o.compute_ms > 0) {
          std::snprintf(line, sizeof line, " %10.1f %10.1f", r.sync_us, r.core_us);
          out << line;
        }
        out << "\n" << std::flush;
      }
    }
  }
  ours.reset();
  ST_MPI_CHECK(MPI_Comm_free(&raw));
  ST_MPI_CHECK(MPI_Comm_free(&group));
  return rows;
}

}  // namespace shardtrain::comm
