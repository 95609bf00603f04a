// The collectives benchmark behind `shardtrain bench collectives` (nccl-tests-style table).
#pragma once
#include <c10/core/ScalarType.h>
#include <mpi.h>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace shardtrain::comm {

struct CollectivesBenchOptions {
  std::string op = "all";  // all_gather | reduce_scatter | all_reduce | all
  int64_t min_bytes = 1024;
  int64_t max_bytes = 64ll << 20;
  std::string dtype = "fp32";  // fp32 | fp64 | bf16 | fp16
  int iters = 20;
  int warmup = 5;
  // > 0: also time each collective issued right after this many milliseconds of compute (a
  // matmul loop) on every rank, without a barrier between: what a collective costs beyond its
  // in-step time when the ranks arrive from computing (on a host whose cores its ranks share,
  // they arrive out of phase and the waiting ones poll on cores the others need).
  double compute_ms = 0;
  // > 0: split the ranks into groups of this many, each running the benchmark at the same time
  // (the traffic of one mesh dimension: its groups' collectives share the hosts and links);
  // contiguous groups {0..g-1}, {g..2g-1}, ... (shard groups inside hosts), or strided
  // (group_strided: ranks equal modulo n/g, the replicate groups). Rows: the slowest group.
  int group_size = 0;
  bool group_strided = false;
};

// One measured row: our Comm (MPI backend) against the raw MPI call on the same buffers.
struct CollectivesBenchRow {
  std::string op;
  int64_t bytes = 0;  // total bytes (see the table header)
  int64_t count = 0;  // total elements
  double time_us = 0, algbw = 0, busbw = 0;
  double raw_time_us = 0, raw_busbw = 0;
  double efficiency = 0;  // raw time / our time (== our busbw / raw busbw)
  // compute_ms > 0: per iteration of "compute, then the collective" minus the same compute alone
  // minus time_us: the collective's cost beyond its time when issued in step (can be < 0: noise);
  // the median over 5 alternating pairs of runs of `iters` iterations.
  double sync_us = 0;
  // compute_ms > 0: per iteration of "issue the collective, max(compute_ms, 2 time_us) of compute
  // meanwhile, wait" minus the compute alone: what it adds to compute running beside it, its core
  // time where the ranks share cores (0 with cores to spare, where its wire time hides).
  double core_us = 0;
};

// Collective over comm. Sizes double from min_bytes to max_bytes. Each iteration is timed
// between barriers; the time of an iteration is the maximum across ranks, and a row
// reports the median over iterations (ours and raw interleaved, iteration by iteration,
// so that noise from other processes hits both alike). Rank 0 prints the table to `out`
// (other ranks print nothing) and every rank gets the rows.
std::vector<CollectivesBenchRow> run_collectives_bench(MPI_Comm comm,
                                                       const CollectivesBenchOptions& opts,
                                                       std::ostream& out);

// A floating dtype by its short or long name or alias (dtype.h: "fp32"/"float32"/"float", ...);
// throws UserError.
at::ScalarType parse_float_dtype(const std::string& text);

}  // namespace shardtrain::comm
