// The communicators fsdp::open_groups makes for hybrid meshes: collectives inside shard and
// replicate groups (simulated hosts).
#include <gtest/gtest.h>

#include "comm_test_util.h"
#include "shardtrain/fsdp/strategy_comms.h"

using namespace shardtrain;
using namespace shardtrain::comm;
using namespace shardtrain::comm::testing;

namespace {

// Runs shard-group and replicate-group collectives on the mesh and checks them against the
// member lists of the DeviceMesh.
void check_mesh(const runtime::DeviceMesh& mesh, const fsdp::StrategyComms& mc) {
  const int S = mesh.shard_size(), R = mesh.replicate_size(), me = mesh.world_rank();
  EXPECT_EQ(mc.world->name(), "world");
  EXPECT_EQ(mc.shard->name(), mesh.shard_group_name());
  EXPECT_EQ(mc.replicate->name(), mesh.replicate_group_name());
  EXPECT_EQ(mc.world->backend(), Backend::Mpi);  // "auto" without GPUs
  EXPECT_EQ(mc.shard->size(), S);
  EXPECT_EQ(mc.shard->rank(), mesh.shard_rank());
  EXPECT_EQ(mc.replicate->size(), R);
  EXPECT_EQ(mc.replicate->rank(), mesh.replicate_rank());

  // FSDP inside the shard group: gather the world ranks of the shard members, 1001 padded.
  const int64_t numel = 1001, total = padded(numel, S), shard = total / S;
  at::Tensor full = padded_values(3, numel, total, at::kBFloat16);
  at::Tensor gathered = at::zeros({total}, at::kBFloat16);
  at::Tensor mine = full.narrow(0, mesh.shard_rank() * shard, shard).clone();
  WorkPtr ag = mc.shard->all_gather(gathered, mine);
  at::Tensor ids = at::empty({S}, at::kLong), id = at::full({1}, me, at::kLong);
  WorkPtr ag_ids = mc.shard->all_gather(ids, id);

  // Gradients: reduce-scatter in the shard group, then all-reduce over replicas (HSDP).
  at::Tensor grad = padded_values(me, numel, total, at::kFloat);
  at::Tensor gshard = at::empty({shard}, at::kFloat);
  WorkPtr rs = mc.shard->reduce_scatter(gshard, grad, ReduceOp::Sum);
  rs->wait();
  WorkPtr ar = mc.replicate->all_reduce(gshard, ReduceOp::Avg);
  at::Tensor rep_ids = at::empty({R}, at::kLong);
  WorkPtr ag_rep = mc.replicate->all_gather(rep_ids, id);
  at::Tensor wsum = at::full({1}, 1.0, at::kDouble);
  WorkPtr wr = mc.world->all_reduce(wsum, ReduceOp::Sum);
  ag->wait(); ag_ids->wait(); ar->wait(); ag_rep->wait(); wr->wait();

  EXPECT_TRUE(same_values(gathered, full));
  for (int c = 0; c < S; ++c) EXPECT_EQ(ids[c].item<int64_t>(), mesh.shard_members()[c]);
  for (int q = 0; q < R; ++q) EXPECT_EQ(rep_ids[q].item<int64_t>(), mesh.replicate_members()[q]);
  EXPECT_EQ(wsum.item<double>(), mesh.world_size());
  // Expected gradient shard: sum over shard members, averaged over replicas = sum over all
  // world ranks / R.
  at::Tensor ref = at::zeros({total}, at::kDouble);
  for (int q = 0; q < mesh.world_size(); ++q) ref += padded_values(q, numel, total, at::kFloat).to(at::kDouble);
  ref = (ref / R).narrow(0, mesh.shard_rank() * shard, shard);
  EXPECT_TRUE(close_values(gshard, ref, at::kFloat));
}

}  // namespace

TEST(CommMesh, HybridGroupsOfSimulatedHosts) {
  const int n = world_size();
  CommOptions o;
  o.timeout_s = 60;
  for (int k = 1; k <= n; ++k) {
    if (n % k) continue;
    SCOPED_TRACE("ranks per simulated host " + std::to_string(k));
    fsdp::GroupOptions go;  // 4 ranks, k=2: 2 x 2
    go.strategy = fsdp::Strategy::HybridShard;
    go.simulate_ranks_per_host = k;
    go.comm = o;
    fsdp::ShardedGroups g = fsdp::open_groups(MPI_COMM_WORLD, go);
    check_mesh(*g.mesh, g.comms);
  }
}

TEST(CommMesh, WholeWorldShardGroup) {
  // 3 ranks (or any n) as one shard group of n: replicate groups of one rank.
  const int n = world_size();
  fsdp::GroupOptions go;
  go.strategy = fsdp::Strategy::HybridShard;
  go.simulate_ranks_per_host = 1;
  go.shard_group_size = n;
  go.backend = "mpi";
  go.comm.timeout_s = 60;
  fsdp::ShardedGroups g = fsdp::open_groups(MPI_COMM_WORLD, go);
  EXPECT_EQ(g.comms.shard->size(), n);
  EXPECT_EQ(g.comms.replicate->size(), 1);
  check_mesh(*g.mesh, g.comms);
}
