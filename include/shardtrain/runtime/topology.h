// Topology: which host each rank runs on, local ranks, GPUs per host and device binding.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

namespace shardtrain::runtime {

struct Topology {
  int world_rank = 0;
  int world_size = 1;
  int host_id = 0;        // dense 0..num_hosts-1, in order of each host's lowest rank
  int num_hosts = 1;
  int local_rank = 0;     // rank among the ranks of this host
  int local_size = 1;
  int gpus_per_host = 0;  // 0 on CPU-only builds or machines (the device is fsdp::select_device's)
  bool simulated = false; // hosts are simulated (parallel.simulate_ranks_per_host)
  std::string hostname;   // the real host name
  std::vector<int> host_of_rank;          // world rank -> host id
  std::vector<std::string> host_names;    // host id -> name ("name#k" when simulated)
};

// Collective over `world`. simulate_ranks_per_host = k > 0 pretends every k consecutive
// ranks form a host (k must divide the world size); 0 discovers real hosts.
Topology discover_topology(MPI_Comm world, int simulate_ranks_per_host);

// This rank's place among the ranks of its real host (MPI_COMM_TYPE_SHARED), not
// parallel.simulate_ranks_per_host's: simulated hosts still share the real one's cores, memory
// and GPUs. Collective over world.
struct HostRanks {
  int rank = 0, size = 1;
};
HostRanks real_host_ranks(MPI_Comm world);

// Number of CUDA devices visible to this process (0 without CUDA).
int visible_cuda_devices();

}  // namespace shardtrain::runtime
