// What the engine communicates, as functions over flat buffers that issue one collective and
// return it in flight with the tensors it needs kept alive; when they run (which hook, which
// bound) is the engine's business (engine_impl.h).
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <utility>
#include <vector>

#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/flat_param.h"

namespace shardtrain::fsdp {

// All-gathers the flat's shards into its (allocated) unsharded buffer; `mine` is this rank's
// slice of it, already filled.
comm::WorkPtr all_gather_flat(comm::Comm& shard, const FlatParam& fp, const at::Tensor& mine);

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

// Sum of squares of a gradient shard in fp64, a chunk of kNormChunkElems at a time (a whole-
// shard fp64 square would be 4x the shard's bytes: the peak of a no_shard step on the host).
double sum_of_squares(const at::Tensor& g);

}  // namespace shardtrain::fsdp
