// make_mesh_comms: one Comm per mesh group, with the backend chosen the same on every rank.
#include "shardtrain/comm/mesh_comms.h"

#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::comm {

MeshComms make_mesh_comms(const runtime::DeviceMesh& mesh, const runtime::Topology& topo,
                          const std::string& backend, const CommOptions& opts) {
  ST_USER_CHECK(backend == "auto" || backend == "mpi" || backend == "nccl",
                "unknown comm backend '", backend, "': expected auto, mpi or nccl");
  // Every rank must pick the same backend, or the groups would never meet: "auto" means
  // NCCL only when every rank has a GPU.
  int has_gpu = topo.device >= 0 ? 1 : 0, all_gpu = 0;
  ST_MPI_CHECK(MPI_Allreduce(&has_gpu, &all_gpu, 1, MPI_INT, MPI_MIN, mesh.world_comm()));
  bool use_nccl = backend == "nccl" || (backend == "auto" && all_gpu && nccl_available());
  MeshComms m;
  auto make = [&](MPI_Comm c, const std::string& name) {
    return use_nccl ? make_nccl_comm(c, name, topo.device, opts) : make_mpi_comm(c, name, opts);
  };
  m.world = make(mesh.world_comm(), "world");
  m.shard = make(mesh.shard_comm(), mesh.shard_group_name());
  m.replicate = make(mesh.replicate_comm(), mesh.replicate_group_name());
  return m;
}

}  // namespace shardtrain::comm
