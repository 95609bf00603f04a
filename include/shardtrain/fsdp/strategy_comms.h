// The one path from an MPI world to what a sharded engine runs on: topology -> compute device ->
// device mesh -> the communicators a strategy needs (open_groups). train, ckpt import, the
// planner's probe, maxbatch, the tests and the benchmarks all call it.
#pragma once
#include <c10/core/Device.h>
#include <mpi.h>

#include <memory>
#include <string>

#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/options.h"
#include "shardtrain/runtime/device_mesh.h"
#include "shardtrain/runtime/topology.h"

namespace shardtrain::fsdp {

// full_shard / shard_grad_op shard over every rank; hybrid_* shard inside the mesh's shard
// group and average across its replicate group; no_shard replicates over every rank.
// The reduce-scatters get their own communicator (and so their own worker thread) so that
// they overlap the all-gathers of the next unit. Owns the Comm objects.
struct StrategyComms {
  std::unique_ptr<comm::Comm> world, shard, shard_rs, replicate;
  std::unique_ptr<comm::Comm> node;  // full_shard with secondary shards: the mesh's shard group
  MPI_Comm shard_mpi = MPI_COMM_SELF;  // the MPI group of `shard` (SELF when not sharded)
  EngineComms engine() const { return {shard.get(), shard_rs.get(), replicate.get(), world.get(), node.get()}; }
  int shard_size() const { return shard ? shard->size() : 1; }
  int replicate_size() const { return replicate ? replicate->size() : 1; }
};

// The device this rank computes on, from a request (run.device): "cpu"; "cuda" = GPU (local
// rank on its real host) mod GPUs torch sees, an error naming run.device when torch has no CUDA
// or a host runs more ranks than it has GPUs (NCCL needs one GPU per rank); "auto" = the same
// GPU when every rank has one, else the CPU on every rank. Collective over world (all ranks
// agree, errors raised on every rank).
c10::Device select_device(const std::string& want, MPI_Comm world);

struct GroupOptions {
  Strategy strategy = Strategy::FullShard;
  int simulate_ranks_per_host = 0;  // parallel.simulate_ranks_per_host (0: the real hosts)
  int shard_group_size = 0;         // parallel.shard_group_size (0: ranks per host)
  std::string device = "cpu";       // run.device: auto | cpu | cuda
  std::string backend = "auto";     // comm.backend: auto | mpi | nccl
  bool secondary_shards = false;    // fsdp.secondary_shards: full_shard also opens the node group
  comm::CommOptions comm;
};

struct ShardedGroups {
  runtime::Topology topo;
  std::unique_ptr<runtime::DeviceMesh> mesh;
  c10::Device device = c10::kCPU;
  StrategyComms comms;
};

// Collective over world; bad options (a mesh that does not divide, a device or backend this
// machine cannot give) raise the same UserError, naming the deck key, on every rank.
ShardedGroups open_groups(MPI_Comm world, const GroupOptions& o);

}  // namespace shardtrain::fsdp
