// LeafPlan: train.reproducible's split of the global batch into leaves (virtual micro-batches
// of train.micro_batch samples, the same at every world size) and which leaves this rank
// computes, in the order the fixed reduction tree needs. The one place that decides it: the
// sampler reads its order, the trainer seeds dropout and sums losses by it, checkpoints record
// it (docs/reproducibility.md).
#pragma once
#include <mpi.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/deck/deck.h"

namespace shardtrain::train {

struct LeafPlan {
  bool on = false;
  int64_t leaves = 1;    // V = global_batch / micro_batch: a power of two
  int64_t per_rank = 1;  // A = V / world: this rank's micro-batches per step
  int group = 1;         // S: ranks of the leaf-level reduce-scatter (the shard group; 1 for no_shard)
  int rank = 0, world = 1;
  // The tree over leaves 0..V-1 pairs 2i and 2i+1 first. The engine sums S leaves across the
  // shard group at each micro-batch, then a rank's A micro-batches, then the V/(A S) replicas;
  // so rank r = g S + s computes, at micro-batch j, leaf g (A S) + j S + s.
  int64_t leaf_of(int r, int64_t j) const { return (r / group) * (per_rank * group) + j * group + r % group; }
  int64_t leaf_of(int64_t j) const { return leaf_of(rank, j); }
};

// train.reproducible's plan for this run: off when the key is false. UserError (exit 2, naming
// the key) for what the scheme cannot serve: no explicit train.global_batch, a leaf count or a
// world size that is not a power of two, more ranks than leaves, a reduction dtype other than
// fp32, a backend without tree collectives. `group`: the shard group's size (1 without one);
// `nccl`: the run's collectives are NCCL's.
LeafPlan plan_leaves(const deck::Deck& d, int world, int rank, int group, bool nccl);

// What the bits depend on besides the deck and the data (recorded in checkpoints; a resume
// that differs in one of them warns): libtorch, the BLAS and its kernel, the CPU, the device,
// the threads per rank, the leaf layout, and for bf16 compute the bf16 GEMM path
// (`bf16_gemm`, model/bf16_gemm.h; "" for other dtypes). Not the world size or the strategy.
nlohmann::json reproducibility_guarantee(const LeafPlan& p, int64_t micro_batch, int threads, const std::string& device,
                                         const std::string& bf16_gemm = "");

// The global batch's loss sum from this rank's leaf losses (micro-batch order): gathered from
// every rank ("step.leaf_losses") and added in leaf order, so the same bits at every world size;
// the mean divides by the leaves, instruction data by the global batch's counted targets.
// Collective (StepAgreement::leaf_loss_sum).
double sum_over_leaves(const std::vector<double>& mine, const LeafPlan& p, MPI_Comm world);

// Lines for the resume notes: each field of `saved` that differs from `now` ("" when all agree).
std::string guarantee_differences(const nlohmann::json& saved, const nlohmann::json& now);

}  // namespace shardtrain::train
