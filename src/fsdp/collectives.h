// What the engine communicates: every collective it issues, as a function over explicit buffers
// and communicators that issues it and returns it in flight (a Work handle, with the tensors it
// needs kept alive). When they run (which hook, which bound, who waits) is the engine's schedule
// (schedule.cpp) and the ZeRO++ state's (zeropp.h); nothing here knows the engine.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <utility>
#include <vector>

#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/flat_param.h"
#include "shardtrain/fsdp/quantize.h"

namespace shardtrain::fsdp {

// ---- parameters ------------------------------------------------------------------

// All-gathers the flat's shards into its (allocated) unsharded buffer; `mine` is this rank's
// slice of it, already filled.
comm::WorkPtr all_gather_flat(comm::Comm& shard, const FlatParam& fp, const at::Tensor& mine);

// hpZ: the flat's unsharded buffer gathered over the node group from the node's secondary
// shards: `secondary` (this rank's chunk, padded / node size) is copied into its slot first.
comm::WorkPtr all_gather_from_secondary(comm::Comm& node, const FlatParam& fp, const at::Tensor& secondary);

// qwZ: the flat's unsharded buffer from every rank's int8-packed shard (quantize.h; `packed`:
// this rank's master shard packed with `block`). The wire is an all-gather of the packed shards;
// waiting for the returned work dequantizes every slice into the unsharded buffer. With `exact`
// (an accuracy-guard step) the full-precision gather of the masters runs beside it; at the wait
// the relative error of the dequantized buffer against it goes to `judge`, and when judge
// returns true the exact values replace the dequantized ones (the flat falls back).
comm::WorkPtr quantized_all_gather_flat(comm::Comm& shard, FlatParam& fp, const at::Tensor& packed, int64_t block,
                                        bool exact, std::function<bool(double rel_error)> judge);

// QLoRA: an NF4 flat's unsharded buffer from every rank's packed shard (fp.packed(), nf4_shard.h):
// the wire is an all-gather of the packed shards (codes and statistics, about 0.26 of the bf16
// bytes with double quantization); waiting for the returned work dequantizes every slice, this
// rank's too, into the unsharded buffer in its compute dtype.
comm::WorkPtr nf4_all_gather_flat(comm::Comm& shard, FlatParam& fp);

// ---- gradients -------------------------------------------------------------------

// Averages an unsharded gradient [padded] over the shard group into this rank's shard, in
// `reduce_dtype` (cast first if the gradient is in another). With `tree` (train.reproducible)
// it sums instead, in the fixed tree (Comm::reduce_scatter_tree). The returned input and output
// stay referenced until the work is retired.
struct ReduceScatter {
  comm::WorkPtr work;
  at::Tensor out, in;
};
ReduceScatter reduce_scatter_grad(comm::Comm& shard, at::Tensor full_grad, at::ScalarType reduce_dtype,
                                  int64_t shard_numel, bool tree = false);

// train.reproducible, a whole flat (the ignored group) in a sharded strategy: its gradient summed
// in place over the shard group in the fixed tree (the level of the tree the other flats'
// reduce-scatters are).
comm::WorkPtr sum_whole_grad_tree(comm::Comm& shard, const at::Tensor& grad);

// Averages gradient shards across replicas: one coalesced all-reduce per communicator (NCCL:
// one group call over all its shards). With `tree` (train.reproducible) it sums instead, one
// Comm::all_reduce_tree per shard. Each entry: the communicator (nullptr or size 1 = no
// replicas: skipped) and the flat whose grad_shard is averaged in place. `on_comm_device`
// gives the tensor a communicator reduces (the shard itself, or a device copy of a host shard).
struct ReplicaAverage {
  std::vector<comm::WorkPtr> works;
  std::vector<std::vector<at::Tensor>> tensors;
  std::vector<std::vector<FlatParam*>> owners;
  // After every work is done: copies results that were reduced in a device copy back.
  void finish();
};
ReplicaAverage average_across_replicas(const std::vector<std::pair<comm::Comm*, FlatParam*>>& shards,
                                       const std::function<at::Tensor(const FlatParam&)>& on_comm_device,
                                       bool tree = false);

// qgZ: the average of x (fp32 [L], this replica's gradient plus its residual) across the
// replicate group in int8 with error feedback: x is packed into this rank's slot of an
// all-gather of every replica's packed vector, and `residual` becomes what quantization left
// out (x minus what the others receive). With `exact` (a guard step) x's exact average runs
// beside it, in place in x (an all-reduce).
struct Int8Average {
  comm::WorkPtr work, exact_work;
  at::Tensor wire, exact;
  int replicas = 1;
  int64_t numel = 0, block = 1;
  // After `work` is done: the replicas' dequantized vectors summed in fp32 in replica order
  // (every replica computes the same bits), divided by their count.
  at::Tensor average() const;
};
Int8Average int8_replica_average(comm::Comm& replicate, const at::Tensor& x, at::Tensor& residual, int64_t block,
                                 bool exact);

// DiLoCo's outer gradient: the AVERAGE of x (fp32 [n], contiguous, on the group's device)
// over `group` in wire format `format` (quantize.h WireFormat, diloco.outer_dtype). x is read
// at the call only (copied or packed; the caller may change or drop it right after); nothing
// is written back into it.
//   fp32: an all-reduce (Avg) of a copy of x; with `tree` (train.reproducible) the fixed-tree
//         sum (Comm::all_reduce_tree, a power-of-two group) divided by the group size.
//   bf16: the same in bf16 (x rounded to bf16 first); the result cast back to fp32.
//   int8 / int4: x packed in blocks of `block` (quantize.h) into this rank's slot of an
//         all-gather of every rank's packed vector; average() dequantizes all and sums them in
//         fp32 in rank order, then divides by the group size: every rank gets the same bits,
//         whatever the backend's algorithm (`tree` changes nothing).
// With `exact` (an accuracy-guard step; meaningful for bf16 / int8 / int4) the fp32 average
// runs beside it (all-reduce Avg, or the tree sum with `tree`); for fp32 it is the average
// itself, no second collective. Bytes one rank sends: wire_average_bytes_sent (quantize.h).
struct WireAverage {
  comm::WorkPtr work, exact_work;  // exact_work: null without `exact` (and for fp32)
  WireFormat format = WireFormat::Fp32;
  int ranks = 1;
  int64_t numel = 0, block = 1;
  bool tree = false;
  at::Tensor wire;   // fp32/bf16: the reduced copy; int8/int4: every rank's packed vector
  at::Tensor exact;  // with `exact`, not fp32: the fp32 copy of x all-reduced beside the wire
  // After work is done: the average, fp32 [numel] (a new tensor, or `wire` itself for fp32).
  at::Tensor average() const;
  // After work and exact_work are done, with `exact`: the exact fp32 average (fp32: average()).
  at::Tensor exact_average() const;
  // Waits for both works (the plain blocking use).
  void wait() const;
};
WireAverage wire_average(comm::Comm& group, const at::Tensor& x, WireFormat format, int64_t block, bool exact = false,
                         bool tree = false);

// ---- scalars and checkpoints -----------------------------------------------------

// Sums t in place over the group (the gradient norm's partial sums, the guard's error terms).
comm::WorkPtr sum_across(comm::Comm& group, const at::Tensor& t);

// Every replica's copy of a shard-sized vector: `mine` goes into this rank's slot of a buffer of
// replicate.size() slots, all-gathered. all.narrow(0, r * L, L) is replica r's after the wait.
struct ReplicaGather {
  comm::WorkPtr work;
  at::Tensor all;
};
ReplicaGather gather_across_replicas(comm::Comm& replicate, const at::Tensor& mine);

// Every member's host id (-1 = unknown) over `group`, for the byte counters' split into bytes
// inside and between hosts (CountingComm): `host_id` in this rank's slot of a double vector
// [group.size()] on `device` (where the group's tensors live), all-gathered; all[r] is member r's
// after the wait.
ReplicaGather gather_host_ids(comm::Comm& group, int host_id, const c10::Device& device);

// Sum of squares of a gradient shard in fp64, a chunk of kNormChunkElems at a time (a whole-
// shard fp64 square would be 4x the shard's bytes: the peak of a no_shard step on the host).
double sum_of_squares(const at::Tensor& g);

}  // namespace shardtrain::fsdp
