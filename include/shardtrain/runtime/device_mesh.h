// DeviceMesh: the 2-D (replicate x shard) arrangement of ranks and its MPI groups.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "shardtrain/runtime/topology.h"

namespace shardtrain::runtime {

// The shard group size of a mesh: parallel.shard_group_size when > 0, else the ranks per host
// (one shard group per host). The one statement of the default: DeviceMesh builds by it, the
// planner and fsdp::strategy_groups size by it.
int mesh_shard_size(int shard_group_size, int ranks_per_host);

// World ranks form a grid of R replicate rows by S shard columns, R*S = world size.
// A rank's shard group holds the S ranks that together own one full copy of the
// model (FSDP inside the group); its replicate group holds the R ranks with the
// same shard position in different copies (data parallel across groups).
// Default S = ranks per host, so shard traffic stays inside a node.
class DeviceMesh {
 public:
  // shard_group_size = 0 picks ranks-per-host. Throws UserError if it does not divide
  // the world size, or if the default is asked for on hosts of unequal rank counts.
  DeviceMesh(MPI_Comm world, const Topology& topo, int shard_group_size);
  ~DeviceMesh();
  DeviceMesh(const DeviceMesh&) = delete;
  DeviceMesh& operator=(const DeviceMesh&) = delete;

  MPI_Comm world_comm() const { return world_; }
  MPI_Comm shard_comm() const { return shard_; }
  MPI_Comm replicate_comm() const { return replicate_; }

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int shard_rank() const { return shard_rank_; }
  int shard_size() const { return shard_size_; }
  int replicate_rank() const { return replicate_rank_; }
  int replicate_size() const { return replicate_size_; }

  // World ranks of this rank's groups, in group-rank order.
  const std::vector<int>& shard_members() const { return shard_members_; }
  const std::vector<int>& replicate_members() const { return replicate_members_; }
  // Whether the shard group stays on one host (true when S divides ranks per host).
  bool shard_group_within_host() const { return shard_within_host_; }
  // Human-readable labels, e.g. "shard[1]" (the replicate index) and "replicate[0]".
  std::string shard_group_name() const;
  std::string replicate_group_name() const;

 private:
  MPI_Comm world_ = MPI_COMM_NULL, shard_ = MPI_COMM_NULL, replicate_ = MPI_COMM_NULL;
  int world_rank_ = 0, world_size_ = 1;
  int shard_rank_ = 0, shard_size_ = 1, replicate_rank_ = 0, replicate_size_ = 1;
  bool shard_within_host_ = true;
  std::vector<int> shard_members_, replicate_members_;
};

}  // namespace shardtrain::runtime
