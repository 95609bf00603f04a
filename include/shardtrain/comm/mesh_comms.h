// MeshComms: the communicators of one DeviceMesh (world, shard group, replicate group).
#pragma once
#include <memory>

#include "shardtrain/comm/comm.h"
#include "shardtrain/runtime/device_mesh.h"

namespace shardtrain::comm {

struct MeshComms {
  std::unique_ptr<Comm> world;
  std::unique_ptr<Comm> shard;
  std::unique_ptr<Comm> replicate;
};

// backend: "auto" (NCCL when the rank has a GPU and NCCL is built, else MPI), "mpi", "nccl".
MeshComms make_mesh_comms(const runtime::DeviceMesh& mesh, const runtime::Topology& topo,
                          const std::string& backend, const CommOptions& opts);

}  // namespace shardtrain::comm
