// ShardedJob: what every sharded command builds from a deck before its own work (train,
// ckpt import, the planner's probe): the deck's settings, then fsdp::open_groups (topology ->
// compute device -> mesh -> communicators), the model on the meta device, engine options.
#pragma once
#include <c10/core/Device.h>
#include <mpi.h>

#include <memory>
#include <optional>
#include <string>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/deck/deck.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/strategy_comms.h"
#include "shardtrain/model/model.h"
#include "shardtrain/runtime/device_mesh.h"
#include "shardtrain/runtime/topology.h"
#include "shardtrain/train/bf16_choice.h"

namespace shardtrain::train {

struct JobOptions {
  std::optional<fsdp::Strategy> strategy;     // default: parallel.strategy
  int ranks_per_host = -1;                    // default: parallel.simulate_ranks_per_host
  std::optional<model::ModelSpec> spec;       // default: the deck's model
  bool host_only = false;                     // a host tool (import, probe): CPU whatever run.device says
};

struct ShardedJob {
  runtime::Topology topo;
  std::unique_ptr<runtime::DeviceMesh> mesh;
  fsdp::Strategy strategy = fsdp::Strategy::FullShard;
  c10::Device device = c10::kCPU;
  int threads = 1;  // intra-op threads set for this rank (run.threads or cores / ranks per host)
  model::ModelSpec spec;
  fsdp::StrategyComms comms;
  std::shared_ptr<model::Model> net;  // parameters on the meta device until an Engine wraps it
  fsdp::EngineOptions engine_options;  // from the deck, with strategy and device filled in
  Bf16GemmChoice bf16_gemm;            // bf16 compute on a CPU: the GEMM path (model::bf16_gemm())
};

// Collective; deck errors (bad mesh, device, backend) are raised on every rank.
ShardedJob open_sharded_job(MPI_Comm world, const deck::Deck& d, const JobOptions& o = {});

// What every checkpoint of this job records about it (resolved deck, model spec, strategy, mesh).
ckpt::CheckpointInfo checkpoint_info(const ShardedJob& job, const deck::Deck& d);

// Parameter initialisation from run.seed, independent of the world size (fresh runs).
fsdp::InitFn seeded_init(const model::Model& m, uint64_t seed);

}  // namespace shardtrain::train
