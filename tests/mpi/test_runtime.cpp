// Topology and DeviceMesh: groups, members and simulated hosts at any rank count.
#include <gtest/gtest.h>

#include <set>

#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/device_mesh.h"
#include "shardtrain/runtime/topology.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;
using namespace shardtrain::runtime;

static int world_size() { int n; MPI_Comm_size(MPI_COMM_WORLD, &n); return n; }
static int world_rank() { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }

TEST(Topology, RealHostIsOneHostHere) {
  Topology t = discover_topology(MPI_COMM_WORLD, 0);
  EXPECT_EQ(t.num_hosts, 1);
  EXPECT_EQ(t.local_size, world_size());
  EXPECT_EQ(t.local_rank, world_rank());
  EXPECT_FALSE(t.hostname.empty());
}

TEST(Topology, SimulatedHostsSplitConsecutiveRanks) {
  const int n = world_size();
  for (int k = 1; k <= n; ++k) {
    if (n % k) continue;
    Topology t = discover_topology(MPI_COMM_WORLD, k);
    EXPECT_TRUE(t.simulated);
    EXPECT_EQ(t.num_hosts, n / k);
    EXPECT_EQ(t.host_id, world_rank() / k);
    EXPECT_EQ(t.local_rank, world_rank() % k);
    EXPECT_EQ(t.local_size, k);
  }
}

// A host size that does not divide the world: the last host holds the rest (2 + 1 for 3 ranks
// in hosts of 2, as Slurm's --ntasks=3 on two nodes), and a size above the world is one host.
TEST(Topology, SimulatedHostsLastHoldsTheRest) {
  const int n = world_size();
  for (int k = 1; k <= n + 1; ++k) {
    if (n % k == 0 && k <= n) continue;
    Topology t = discover_topology(MPI_COMM_WORLD, k);
    EXPECT_TRUE(t.simulated);
    EXPECT_EQ(t.num_hosts, (n + k - 1) / k) << "k " << k;
    EXPECT_EQ(t.host_id, world_rank() / k);
    EXPECT_EQ(t.local_rank, world_rank() % k);
    const int last = n - (t.num_hosts - 1) * k;
    EXPECT_EQ(t.local_size, t.host_id == t.num_hosts - 1 ? last : k) << "k " << k;
  }
}

TEST(DeviceMesh, DefaultShardGroupIsTheHost) {
  const int n = world_size();
  for (int k = 1; k <= n; ++k) {
    if (n % k) continue;
    Topology t = discover_topology(MPI_COMM_WORLD, k);
    DeviceMesh mesh(MPI_COMM_WORLD, t, 0);
    EXPECT_EQ(mesh.shard_size(), k);
    EXPECT_EQ(mesh.replicate_size(), n / k);
    EXPECT_EQ(mesh.shard_rank(), world_rank() % k);
    EXPECT_EQ(mesh.replicate_rank(), world_rank() / k);
    EXPECT_TRUE(mesh.shard_group_within_host());
    for (int m : mesh.shard_members()) EXPECT_EQ(t.host_of_rank[m], t.host_id);
    std::set<int> hosts;
    for (int m : mesh.replicate_members()) hosts.insert(t.host_of_rank[m]);
    EXPECT_EQ(static_cast<int>(hosts.size()), n / k);  // one member per host
    // The MPI groups agree with the member lists.
    int sum = 0, expect = 0;
    for (int m : mesh.shard_members()) expect += m;
    int me = world_rank();
    MPI_Allreduce(&me, &sum, 1, MPI_INT, MPI_SUM, mesh.shard_comm());
    EXPECT_EQ(sum, expect);
    expect = 0;
    for (int m : mesh.replicate_members()) expect += m;
    MPI_Allreduce(&me, &sum, 1, MPI_INT, MPI_SUM, mesh.replicate_comm());
    EXPECT_EQ(sum, expect);
  }
}

TEST(DeviceMesh, ExplicitShardSizeAcrossSimulatedHosts) {
  const int n = world_size();
  if (n != 4) GTEST_SKIP() << "needs 4 ranks";
  Topology t = discover_topology(MPI_COMM_WORLD, 1);  // 4 hosts of 1 rank
  DeviceMesh mesh(MPI_COMM_WORLD, t, 2);
  EXPECT_EQ(mesh.shard_size(), 2);
  EXPECT_FALSE(mesh.shard_group_within_host());
  EXPECT_THROW(DeviceMesh(MPI_COMM_WORLD, t, 3), UserError);
}

TEST(Agree, OneFailingRankFailsAllWithItsMessage) {
  const int n = world_size();
  try {
    run_agreed(MPI_COMM_WORLD, [&] {
      if (world_rank() == n - 1) throw UserError("rank says no");
    });
    FAIL() << "expected an exception";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "rank says no");
    EXPECT_TRUE(e.agreed());
  }
  EXPECT_NO_THROW(run_agreed(MPI_COMM_WORLD, [] {}));
}
