// make_strategy_comms: picks the groups for a strategy and one backend for all ranks.
#include "shardtrain/fsdp/strategy_comms.h"

#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::fsdp {

StrategyComms make_strategy_comms(Strategy s, const runtime::DeviceMesh& mesh, const std::string& backend,
                                  int device, const comm::CommOptions& opts) {
  ST_USER_CHECK(backend == "auto" || backend == "mpi" || backend == "nccl", "unknown comm.backend '",
                backend, "' (auto, mpi, nccl)");
  // Every rank must choose the same backend or the groups never meet.
  int has_gpu = device >= 0 ? 1 : 0, all_gpu = 0;
  ST_MPI_CHECK(MPI_Allreduce(&has_gpu, &all_gpu, 1, MPI_INT, MPI_MIN, mesh.world_comm()));
  const bool nccl = backend == "nccl" || (backend == "auto" && all_gpu && comm::nccl_available());
  ST_USER_CHECK(!(backend == "nccl" && !all_gpu), "comm.backend = nccl needs a GPU on every rank");
  auto make = [&](MPI_Comm c, const std::string& name) {
    return nccl ? comm::make_nccl_comm(c, name, device, opts) : comm::make_mpi_comm(c, name, opts);
  };
  StrategyComms sc;
  sc.world = make(mesh.world_comm(), "world");
  if (is_hybrid(s)) {
    sc.shard = make(mesh.shard_comm(), mesh.shard_group_name());
    sc.shard_rs = make(mesh.shard_comm(), mesh.shard_group_name() + ".rs");
    sc.replicate = make(mesh.replicate_comm(), mesh.replicate_group_name());
    sc.shard_mpi = mesh.shard_comm();
  } else if (s == Strategy::NoShard) {
    sc.replicate = make(mesh.world_comm(), "world.dp");
  } else {
    sc.shard = make(mesh.world_comm(), "shard[world]");
    sc.shard_rs = make(mesh.world_comm(), "shard[world].rs");
    sc.shard_mpi = mesh.world_comm();
  }
  return sc;
}

}  // namespace shardtrain::fsdp
