// Wrap policy and flat layout: which modules become FSDP units, which parameters each unit's
// flat parameters hold and in which order, how each flat is padded for its shard group, and which
// flats alias their fp32 masters. fsdp::Engine builds its units from this plan; the memory planner
// (plan/strategy_plan.cpp) and the tests read it instead of deriving it again.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/fsdp/nf4_shard.h"
#include "shardtrain/fsdp/options.h"

namespace shardtrain::fsdp {

// Elements of a flat of `numel` elements padded for a shard group of S ranks: the least multiple
// of S that holds them, and at least S (every rank owns padded / S elements).
int64_t padded_numel(int64_t numel, int S);

// Whether a flat's unsharded buffer and its master are one storage: a flat nobody shards
// (S == 1), not offloaded (cpu_offload keeps the master in host memory), whose master is in its
// compute dtype: fp32, or any dtype when frozen (a frozen flat's master is kept in the compute
// dtype), never an NF4 flat (its shard is codes). Nothing is then gathered or freed, and gradients
// accumulate straight into the gradient shard.
bool aliases_master(int shard_size, at::ScalarType dtype, bool offloaded, bool frozen = false, bool nf4 = false);

// The modules of a tree in pre-order with their qualified paths (the root first, path ""), and
// its distinct parameters (tied weights once, by TensorImpl) in discovery order (modules in
// pre-order, each module's own parameters in registration order), each named by its first
// qualified name, with every (module, local name) that holds it. Pointers borrow from the tree.
struct ModuleTree {
  struct Param {
    std::string name;
    at::Tensor tensor;
    std::vector<std::pair<torch::nn::Module*, std::string>> owners;
    int module = 0;  // index in `modules` of the first owner (whose path names it)
  };
  std::vector<std::pair<std::string, torch::nn::Module*>> modules;  // pre-order, the root first
  std::vector<int> parent;  // per module: its parent's index (-1 for the root)
  std::vector<Param> params;
};
ModuleTree module_tree(torch::nn::Module& root);

// One parameter's place in its flat.
struct ParamPlan {
  std::string name;             // qualified name, as in root.named_parameters()
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;           // element offset in the unsharded flat buffer
  int index = -1;               // in ModuleTree::params
};

// One flat parameter: a unit's parameters of one dtype, concatenated, padded, sharded.
struct FlatPlan {
  at::ScalarType dtype = at::kFloat;  // compute dtype of the unsharded buffer
  std::vector<ParamPlan> params;      // flat order
  int64_t numel = 0;                  // the parameters' elements
  int64_t padded = 0;                 // padded_numel(numel, shard_size)
  int64_t shard_numel = 0;            // padded / shard_size: what each rank of the group owns
  int shard_size = 1;                 // the shard group (1 for the ignored group)
  bool aliases_master = false;        // see fsdp::aliases_master
  // Parameters that do not train (requires_grad false at wrap time: train.freeze, a LoRA base):
  // the shard is kept in the compute dtype (no fp32 master), with no gradient, no optimizer
  // state and no reduction; it is only gathered.
  bool frozen = false;
  // Frozen NF4 weights (EngineOptions::nf4): each parameter at a multiple of nf4_format.align()
  // elements, padded to a multiple of shard_size * align(); the shard is nf4_shard.h's byte vector.
  bool nf4 = false;
  nf4::Format nf4_format;
  // Bytes of this rank's shard at rest: fp32 masters, frozen shards in their compute dtype, NF4
  // shards as codes and statistics.
  int64_t shard_bytes() const {
    return nf4 ? nf4_format.shard_bytes(shard_numel) : shard_numel * (frozen ? elem_bytes() : 4);
  }
  int64_t elem_bytes() const { return static_cast<int64_t>(c10::elementSize(dtype)); }
  int64_t full_bytes() const { return padded * elem_bytes(); }  // the unsharded buffer
};

// What a unit is: the root (the whole model: it owns every parameter no other unit claims and
// stays unsharded from its forward to the end of backward), a block (a wrapped module), or the
// ignored group (parameters kept whole on every rank, averaged like DDP; no module).
enum class UnitKind { Root, Block, Ignored };

struct UnitPlan {
  std::string name;              // "<root>", the module's path ("transformer.h.0"), "<ignored>"
  int module = -1;               // in ModuleTree::modules (0: the root; -1: the ignored group)
  UnitKind kind = UnitKind::Block;
  bool is_root() const { return kind == UnitKind::Root; }
  bool is_ignored() const { return kind == UnitKind::Ignored; }
  // Trainable parameters first (compute dtype, then fp32 for keep_fp32 under mixed precision),
  // then frozen ones in the same two dtypes, then frozen NF4 ones (EngineOptions::nf4); only the
  // kinds the unit has.
  std::vector<FlatPlan> flats;
  int64_t numel() const;
  int num_params() const;
  int num_trainable_params() const;  // the parameters whose gradients the unit waits for
  bool has_frozen() const;
};

// The units of `tree` under `opts` (wrap_types / min_num_params, ignored, mp.param_dtype,
// mp.keep_fp32, cpu_offload), laid out for a shard group of `shard_size` ranks, in wrap order:
// the root first (it owns every parameter no other unit claims), then the wrapped modules in
// pre-order, then the ignored group (if any parameter matches `opts.ignored`; kept whole, group
// size 1). Wrapping walks the modules bottom-up: a Hookable module becomes a unit when its
// Module::name() is in wrap_types, or when its not-yet-claimed, not-ignored parameters number at
// least min_num_params; each parameter belongs to the innermost unit that contains it. A
// parameter whose requires_grad is false is frozen (FlatPlan::frozen): it gets flats of its own.
std::vector<UnitPlan> plan_units(const ModuleTree& tree, const EngineOptions& opts, int shard_size);
std::vector<UnitPlan> plan_units(torch::nn::Module& root, const EngineOptions& opts, int shard_size);

}  // namespace shardtrain::fsdp
