// Topology discovery: host ids from an all-gather of host names, local ranks, GPU binding.
#include "shardtrain/runtime/topology.h"

#include <unistd.h>

#include <map>

#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::runtime {

HostRanks real_host_ranks(MPI_Comm world) {
  MPI_Comm local = MPI_COMM_NULL;
  ST_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
  HostRanks h;
  ST_MPI_CHECK(MPI_Comm_rank(local, &h.rank));
  ST_MPI_CHECK(MPI_Comm_size(local, &h.size));
  ST_MPI_CHECK(MPI_Comm_free(&local));
  return h;
}

Topology discover_topology(MPI_Comm world, int simulate_ranks_per_host) {
  Topology t;
  ST_MPI_CHECK(MPI_Comm_rank(world, &t.world_rank));
  ST_MPI_CHECK(MPI_Comm_size(world, &t.world_size));

  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  ST_MPI_CHECK(MPI_Get_processor_name(name, &len));
  t.hostname.assign(name, len);

  // All-gather fixed-size names; hosts are numbered by their lowest rank so the ids
  // are the same on every rank and follow rank order.
  std::vector<char> all(static_cast<size_t>(t.world_size) * MPI_MAX_PROCESSOR_NAME, 0);
  ST_MPI_CHECK(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                             MPI_MAX_PROCESSOR_NAME, MPI_CHAR, world));
  t.host_of_rank.resize(t.world_size);
  if (simulate_ranks_per_host > 0) {
    // k not dividing the world size: the last host holds the rest (as Slurm's --ntasks=3 on
    // two nodes gives 2 + 1), so unequal hosts can be tested on one machine.
    t.simulated = true;
    for (int r = 0; r < t.world_size; ++r) t.host_of_rank[r] = r / simulate_ranks_per_host;
    t.num_hosts = (t.world_size + simulate_ranks_per_host - 1) / simulate_ranks_per_host;
    for (int h = 0; h < t.num_hosts; ++h)
      t.host_names.push_back(t.hostname + "#" + std::to_string(h));
  } else {
    std::map<std::string, int> ids;
    for (int r = 0; r < t.world_size; ++r) {
      std::string h(&all[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
      auto it = ids.find(h);
      if (it == ids.end()) {
        it = ids.emplace(h, static_cast<int>(ids.size())).first;
        t.host_names.push_back(h);
      }
      t.host_of_rank[r] = it->second;
    }
    t.num_hosts = static_cast<int>(ids.size());
  }
  t.host_id = t.host_of_rank[t.world_rank];
  t.local_rank = 0;
  t.local_size = 0;
  for (int r = 0; r < t.world_size; ++r) {
    if (t.host_of_rank[r] != t.host_id) continue;
    if (r < t.world_rank) ++t.local_rank;
    ++t.local_size;
  }
  t.gpus_per_host = visible_cuda_devices();
  return t;
}

}  // namespace shardtrain::runtime
