// open_groups: topology, compute device, mesh and a strategy's communicators, decided once.
#include "shardtrain/fsdp/strategy_comms.h"

#include <algorithm>

#include "shardtrain/fsdp/device.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/util/choices.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/log.h"

namespace shardtrain::fsdp {
namespace {

// The communicators of strategy s on the mesh, one backend on every rank. device: the rank's
// CUDA device or -1.
StrategyComms make_strategy_comms(Strategy s, const runtime::DeviceMesh& mesh, const std::string& backend,
                                  int device, const comm::CommOptions& opts, bool secondary_shards) {
  ST_USER_CHECK(choices::index_of(choices::kBackends, backend) >= 0, "unknown comm.backend '", backend, "' (",
                choices::joined(choices::kBackends), ")");
  // Every rank must choose the same backend or the groups never meet.
  const bool all_gpu = runtime::all_agree(mesh.world_comm(), device >= 0, "setup.backend");
  const bool nccl = backend == "nccl" || (backend == "auto" && all_gpu && comm::nccl_available());
  ST_USER_CHECK(!(backend == "nccl" && !all_gpu), "comm.backend = nccl needs a GPU on every rank");
  auto make = [&](MPI_Comm c, const std::string& name) {
    return nccl ? comm::make_nccl_comm(c, name, device, opts) : comm::make_mpi_comm(c, name, opts);
  };
  StrategyComms sc;
  sc.world = make(mesh.world_comm(), "world");
  // Opened in the same order on every rank (shard, its reduce-scatter twin, replicate, node):
  // communicator creation is collective.
  const StrategyGroups g = strategy_groups(s, mesh.world_size(), mesh.shard_size());
  if (g.shard == GroupSpan::MeshShard) {
    sc.shard = make(mesh.shard_comm(), mesh.shard_group_name());
    sc.shard_rs = make(mesh.shard_comm(), mesh.shard_group_name() + ".rs");
    sc.shard_mpi = mesh.shard_comm();
  } else if (g.shard == GroupSpan::World) {
    sc.shard = make(mesh.world_comm(), "shard[world]");
    sc.shard_rs = make(mesh.world_comm(), "shard[world].rs");
    sc.shard_mpi = mesh.world_comm();
  }
  if (g.replicate == GroupSpan::MeshReplicate) sc.replicate = make(mesh.replicate_comm(), mesh.replicate_group_name());
  else if (g.replicate == GroupSpan::World) sc.replicate = make(mesh.world_comm(), "world.dp");
  if (secondary_shards && compression_support(s).secondary_shards)
    sc.node = make(mesh.shard_comm(), mesh.shard_group_name() + ".hpz");
  return sc;
}

}  // namespace

c10::Device select_device(const std::string& want, MPI_Comm world) {
  ST_USER_CHECK(choices::index_of(choices::kDevices, want) >= 0, "run.device = '", want, "': expected ",
                choices::joined(choices::kDevices));
  // Two ranks on one GPU would put one device twice into an NCCL communicator.
  const runtime::HostRanks host = runtime::real_host_ranks(world);
  const int gpus = want == "cpu" ? 0 : cuda_device_count();
  const int usable = gpus > 0 && host.size <= gpus ? 1 : 0;
  const bool all_usable = runtime::all_agree(world, usable != 0, "setup.device");
  runtime::run_agreed(world, [&] {
    if (want != "cuda" || usable) return;
    if (!torch_built_with_cuda())
      throw UserError("run.device = cuda, but this build's libtorch has no CUDA (build against a CUDA libtorch: "
                      "docs/gpu.md), or use run.device = auto | cpu");
    if (gpus == 0) throw UserError("run.device = cuda, but torch sees no CUDA device on this rank's host");
    throw UserError(log::fmt("run.device = cuda, but this host runs ", host.size, " ranks on ", gpus,
                             " GPUs: NCCL needs a GPU per rank (launch at most ", gpus, " ranks per host)"));
  });
  if (want == "cpu" || !all_usable) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(host.rank % gpus));
}

namespace {
// The mesh's shard group size for a strategy. full_shard, shard_grad_op and no_shard shard or
// replicate over the whole world and use no per-host group (except full_shard's ZeRO++ hpZ
// secondary shards, one per host): with hosts of unequal rank counts (Slurm's --ntasks=3 on two
// nodes: 2 + 1) and shard_group_size = 0 (ranks per host) their mesh is one group of all ranks.
// The hybrid strategies need equal groups, and DeviceMesh says so.
int mesh_group_size(const GroupOptions& o, const runtime::Topology& t) {
  if (o.shard_group_size != 0 || is_hybrid(o.strategy) || (o.secondary_shards && compression_support(o.strategy).secondary_shards))
    return o.shard_group_size;
  const auto first = std::count(t.host_of_rank.begin(), t.host_of_rank.end(), 0);
  for (int h = 1; h < t.num_hosts; ++h)
    if (std::count(t.host_of_rank.begin(), t.host_of_rank.end(), h) != first) return t.world_size;
  return 0;  // equal hosts: rows per host, as before
}
}  // namespace

ShardedGroups open_groups(MPI_Comm world, const GroupOptions& o) {
  ShardedGroups g;
  runtime::run_agreed(world, [&] {
    g.topo = runtime::discover_topology(world, o.simulate_ranks_per_host);
    g.mesh = std::make_unique<runtime::DeviceMesh>(world, g.topo, mesh_group_size(o, g.topo));
  });
  g.device = select_device(o.device, world);
  runtime::run_agreed(world, [&] {
    // The MPI backend reduces host memory; NCCL reduces device memory.
    ST_USER_CHECK(!(g.device.is_cuda() && o.backend == "mpi"), "comm.backend = mpi reduces host memory, but "
                  "run.device places this run on ", g.device.str(), ": use comm.backend = auto or nccl");
    g.comms = make_strategy_comms(o.strategy, *g.mesh, o.backend, g.device.is_cuda() ? g.device.index() : -1, o.comm,
                                 o.secondary_shards);
  });
  return g;
}

}  // namespace shardtrain::fsdp
