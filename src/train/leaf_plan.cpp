// plan_leaves and the reproducibility guarantee (see leaf_plan.h).
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/train/leaf_plan.h"

#include <torch/version.h>

#include "shardtrain/runtime/blas_kernel.h"
#include "shardtrain/util/cpu_isa.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/log.h"

namespace shardtrain::train {
namespace {

bool power_of_two(int64_t n) { return n >= 1 && (n & (n - 1)) == 0; }

std::string sizes_up_to(int64_t v) {
  std::string s;
  for (int64_t n = 1; n <= v && n <= (int64_t{1} << 20); n *= 2) s += (s.empty() ? "" : ", ") + std::to_string(n);
  return s;
}

}  // namespace

LeafPlan plan_leaves(const deck::Deck& d, int world, int rank, int group, bool nccl) {
  LeafPlan p;
  p.rank = rank;
  p.world = world;
  if (!d.get_bool("train.reproducible")) return p;
  const std::string key = d.origin("train.reproducible") + ": train.reproducible = true";
  const int64_t gb = d.get_int("train.global_batch"), mb = d.get_int("train.micro_batch");
  ST_USER_CHECK(gb > 0, key,
                " needs train.global_batch: without it the global batch is micro_batch x grad_accum x ranks and "
                "changes with the world size");
  // gb is a multiple of mb at any world size (Deck::check_relations); the leaves' count and
  // the world's relation to it are this scheme's own rules.
  ST_USER_CHECK(power_of_two(gb / mb), key,
                " sums gradients in a binary tree over train.global_batch / train.micro_batch = ", gb, " / ", mb,
                " leaves, which must be a power of two");
  p.leaves = gb / mb;
  ST_USER_CHECK(power_of_two(world) && world <= p.leaves, key, " serves world sizes ", sizes_up_to(p.leaves), " (",
                p.leaves, " leaves of train.micro_batch = ", mb, " samples, at least one per rank); this run has ",
                world, " ranks");
  ST_USER_CHECK(!nccl, key,
                " needs collectives that sum in a fixed tree, which only the MPI backend has (comm.backend = mpi)");
  ST_USER_CHECK(d.get_string("fsdp.reduce_dtype") == "fp32", key,
                " reduces in fp32: fsdp.reduce_dtype = ", d.get_string("fsdp.reduce_dtype"),
                " would round partial sums whose grouping changes with the world size");
  p.on = true;
  p.per_rank = p.leaves / world;
  p.group = std::max(1, group);
  ST_CHECK(world % p.group == 0, "leaf plan: group ", p.group, " does not divide the world ", world);
  return p;
}

double sum_over_leaves(const std::vector<double>& mine, const LeafPlan& p, MPI_Comm world) {
  ST_CHECK(static_cast<int64_t>(mine.size()) == p.per_rank, "leaf losses: ", mine.size(), " on this rank, the plan has ",
           p.per_rank);
  const std::vector<double> all = runtime::all_gather(world, mine, "step.leaf_losses");
  std::vector<double> by_leaf(static_cast<size_t>(p.leaves));
  for (int r = 0; r < p.world; ++r)
    for (int64_t j = 0; j < p.per_rank; ++j) by_leaf[p.leaf_of(r, j)] = all[r * p.per_rank + j];
  double sum = 0;
  for (double v : by_leaf) sum += v;
  return sum;
}

nlohmann::json reproducibility_guarantee(const LeafPlan& p, int64_t micro_batch, int threads,
                                         const std::string& device, const std::string& bf16_gemm) {
  const runtime::BlasKernel& k = runtime::blas_kernel();
  nlohmann::json j;
  j["libtorch"] = TORCH_VERSION;
  j["blas"] = k.library.empty() ? std::string("none") : k.library + (k.core.empty() ? "" : " (" + k.core + ")");
  j["cpu"] = cpu_isa().model_name;
  j["device"] = device;
  j["threads_per_rank"] = threads;
  j["leaves"] = p.leaves;
  j["leaf_samples"] = micro_batch;
  if (!bf16_gemm.empty()) j["bf16_gemm"] = bf16_gemm;
  return j;
}

std::string guarantee_differences(const nlohmann::json& saved, const nlohmann::json& now) {
  std::string out;
  for (auto it = now.begin(); it != now.end(); ++it) {
    const std::string was = saved.contains(it.key()) ? saved[it.key()].dump() : std::string("(not recorded)");
    if (was != it.value().dump())
      out += log::fmt("# warning: train.reproducible: ", it.key(), " was ", was, " when the checkpoint was written, is ",
                      it.value().dump(), " now: the continuation's bits can differ from an uninterrupted run's\n");
  }
  return out;
}

}  // namespace shardtrain::train
