// DeviceMesh: splits the world into shard groups (rows of S) and replicate groups (columns).
#include "shardtrain/runtime/device_mesh.h"

#include <algorithm>

#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::runtime {

int mesh_shard_size(int shard_group_size, int ranks_per_host) {
  return shard_group_size > 0 ? shard_group_size : ranks_per_host;
}

DeviceMesh::DeviceMesh(MPI_Comm world, const Topology& topo, int shard_group_size) {
  ST_MPI_CHECK(MPI_Comm_dup(world, &world_));
  world_rank_ = topo.world_rank;
  world_size_ = topo.world_size;

  const int S = mesh_shard_size(shard_group_size, topo.local_size);
  if (shard_group_size <= 0) {
    // Default: one shard group per host. Hosts must hold equal numbers of ranks, and
    // (as mpirun and srun place them by default) consecutive ones.
    for (int r = 0; r < world_size_; ++r) {
      int h = topo.host_of_rank[r];
      int count = static_cast<int>(std::count(topo.host_of_rank.begin(), topo.host_of_rank.end(), h));
      ST_USER_CHECK(count == S, "parallel.shard_group_size = 0 (ranks per host) needs the same "
                    "number of ranks on every host; host ", topo.host_names[h], " has ", count,
                    " and host ", topo.host_names[topo.host_id], " has ", S,
                    ". Set parallel.shard_group_size explicitly.");
      ST_USER_CHECK(topo.host_of_rank[r] == r / S, "parallel.shard_group_size = 0 (ranks per "
                    "host) needs consecutive ranks on each host (mapping by slot); rank ", r,
                    " is on host ", topo.host_names[h], ". Set parallel.shard_group_size explicitly.");
    }
  }
  ST_USER_CHECK(S >= 1 && S <= world_size_ && world_size_ % S == 0, "parallel.shard_group_size = ",
                S, " must divide the world size ", world_size_);
  shard_size_ = S;
  replicate_size_ = world_size_ / S;
  const int row = world_rank_ / S, col = world_rank_ % S;
  ST_MPI_CHECK(MPI_Comm_split(world_, row, col, &shard_));
  ST_MPI_CHECK(MPI_Comm_split(world_, col, row, &replicate_));
  ST_MPI_CHECK(MPI_Comm_set_errhandler(shard_, MPI_ERRORS_RETURN));
  ST_MPI_CHECK(MPI_Comm_set_errhandler(replicate_, MPI_ERRORS_RETURN));
  ST_MPI_CHECK(MPI_Comm_rank(shard_, &shard_rank_));
  ST_MPI_CHECK(MPI_Comm_rank(replicate_, &replicate_rank_));
  for (int c = 0; c < S; ++c) shard_members_.push_back(row * S + c);
  for (int r = 0; r < replicate_size_; ++r) replicate_members_.push_back(r * S + col);
  shard_within_host_ = true;
  for (int m : shard_members_)
    if (topo.host_of_rank[m] != topo.host_id) shard_within_host_ = false;
  // The answer must be the same everywhere (it selects algorithms), so agree on it.
  int local = shard_within_host_ ? 1 : 0, all = 0;
  ST_MPI_CHECK(MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, world_));
  shard_within_host_ = all == 1;
}

DeviceMesh::~DeviceMesh() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (shard_ != MPI_COMM_NULL) MPI_Comm_free(&shard_);
  if (replicate_ != MPI_COMM_NULL) MPI_Comm_free(&replicate_);
  if (world_ != MPI_COMM_NULL) MPI_Comm_free(&world_);
}

std::string DeviceMesh::shard_group_name() const {
  return "shard[" + std::to_string(world_rank_ / shard_size_) + "]";
}
std::string DeviceMesh::replicate_group_name() const {
  return "replicate[" + std::to_string(world_rank_ % shard_size_) + "]";
}

}  // namespace shardtrain::runtime
