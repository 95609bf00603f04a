// StrategyComms: the communicators a sharding strategy needs, built from the device mesh.
#pragma once
#include <memory>
#include <string>

#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/options.h"
#include "shardtrain/runtime/device_mesh.h"

namespace shardtrain::fsdp {

// full_shard / shard_grad_op shard over every rank; hybrid_* shard inside the mesh's shard
// group and average across its replicate group; no_shard replicates over every rank.
// The reduce-scatters get their own communicator (and so their own worker thread) so that
// they overlap the all-gathers of the next unit. Owns the Comm objects.
struct StrategyComms {
  std::unique_ptr<comm::Comm> world, shard, shard_rs, replicate;
  MPI_Comm shard_mpi = MPI_COMM_SELF;  // the MPI group of `shard` (SELF when not sharded)
  EngineComms engine() const { return {shard.get(), shard_rs.get(), replicate.get(), world.get()}; }
  int shard_size() const { return shard ? shard->size() : 1; }
  int replicate_size() const { return replicate ? replicate->size() : 1; }
};

// backend: "auto" | "mpi" | "nccl"; device: the rank's CUDA device or -1. Collective.
StrategyComms make_strategy_comms(Strategy s, const runtime::DeviceMesh& mesh, const std::string& backend,
                                  int device, const comm::CommOptions& opts);

}  // namespace shardtrain::fsdp
