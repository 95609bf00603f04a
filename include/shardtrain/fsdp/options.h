// FSDP engine options: strategy, mixed precision, wrap policy, prefetch, recomputation.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace shardtrain::fsdp {

// Names follow PyTorch so users recognise them (docs/fsdp.md has the table).
enum class Strategy { FullShard, ShardGradOp, NoShard, HybridShard, HybridShardZero2 };
enum class BackwardPrefetch { Pre, Post, None };

Strategy parse_strategy(const std::string& s);        // "full_shard", ... (UserError otherwise)
const char* to_string(Strategy s);
BackwardPrefetch parse_backward_prefetch(const std::string& s);
at::ScalarType parse_dtype(const std::string& s);     // "fp32" | "bf16" | "fp16" (or torch's long names)
const char* dtype_name(at::ScalarType t);             // comm::dtype_short_name
bool is_hybrid(Strategy s);
// Whether a unit's parameters are freed right after its forward (ZeRO-3) or kept until
// its backward ends (ZeRO-2).
bool reshards_after_forward(Strategy s);

struct MixedPrecision {
  at::ScalarType param_dtype = at::kFloat;   // compute dtype of unsharded parameters
  at::ScalarType reduce_dtype = at::kFloat;  // dtype in which gradients are reduced
  at::ScalarType buffer_dtype = at::kFloat;  // dtype of module buffers (none in our models yet)
  std::vector<std::string> keep_fp32;        // parameter-name substrings kept in fp32
};

// Less traffic between nodes (ZeRO++; docs/strategies.md). Deck keys fsdp.quantize_weights,
// fsdp.quantize_grads, fsdp.quant_block, fsdp.quant_guard_every, fsdp.quant_guard_threshold,
// fsdp.secondary_shards.
struct Compression {
  bool quantize_weights = false;  // qwZ: the weight all-gather moves int8 codes + per-block scales
  bool quantize_grads = false;    // qgZ: the gradient average across replicas in int8, error feedback
  int64_t block = 256;            // values per quantization block (one fp32 scale each)
  int guard_every = 0;            // every K optimizer steps also compute the exact result; 0 = off
  double guard_threshold = 0.05;  // relative error above which a unit falls back to full precision
  // hpZ (FSDP2's reshard_after_forward = <node size>): full_shard keeps, after a unit's forward,
  // a secondary shard over the ranks of its node, so the backward all-gather stays inside the
  // node. Needs EngineComms::node.
  bool secondary_shards = false;
  bool any() const { return quantize_weights || quantize_grads || secondary_shards; }
};

// How the replicas of the hybrid strategies stay in step (parallel.replica_sync and the [diloco]
// section; docs/strategies.md#diloco-replicas-that-synchronise-rarely). EveryStep: gradients averaged across replicas every
// optimizer step. DiLoCo: each replica trains alone (gradients averaged over its shard group only,
// its own gradient norm, its own inner optimizer steps); every inner_steps steps the outer
// gradient of a fragment (its shard at the last sync minus now) is averaged across replicas and
// applied by an outer SGD with (Nesterov) momentum to the outer copy, which every replica takes.
enum class ReplicaSyncMode { EveryStep, DiLoCo };  // choices::kReplicaSync's order
// How an fp32 vector travels when it is averaged over a group (collectives.h wire_average;
// diloco.outer_dtype), in the order of choices::kOuterDtypes: fp32 and bf16 are all-reduced in
// that dtype; int8 and int4 are block-packed (quantize.h) and all-gathered, every rank summing
// the dequantized vectors in rank order. Names: quantize.h parse_wire_format / wire_format_name.
enum class WireFormat { Fp32, Bf16, Int8, Int4 };
struct ReplicaSync {
  ReplicaSyncMode mode = ReplicaSyncMode::EveryStep;
  int64_t inner_steps = 100;    // H
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  bool nesterov = true;
  int fragments = 1;            // consecutive groups of units, each synced at its own offset
  int64_t overlap_steps = 0;    // tau: inner steps between issuing a fragment's average and applying it
  WireFormat outer_dtype = WireFormat::Fp32;
  bool diloco() const { return mode == ReplicaSyncMode::DiLoCo; }
};
// The fragment of unit u of `units` cut into `fragments` consecutive fragments, as even as can
// be: u * fragments / units. The one statement of the rule: OuterSync and the planner use it.
int fragment_of_unit(int unit, int units, int fragments);
// The rule that goes with it, checked by the engine and the planner: a fragment is one or more
// whole units (UserError naming diloco.fragments otherwise).
void check_fragments(int fragments, int units);
ReplicaSyncMode parse_replica_sync(const std::string& s);  // UserError naming parallel.replica_sync otherwise

// QLoRA (lora.base_dtype = "nf4"): the frozen parameters named in `params` (a LoRA base's linear
// weights in the blocks: model::nf4_base_params) are stored as NF4 codes (nf4.h) in blocks of
// `block` values, their statistics double-quantized with `double_quant`. Each gets an NF4 flat of
// its own kind (FlatPlan::nf4): its shard holds codes and statistics, its all-gather moves them and
// every rank dequantizes into param_dtype for compute (nf4_shard.h has the layout).
struct Nf4Base {
  int64_t block = 0;  // 0: off
  bool double_quant = false;
  std::vector<std::string> params;  // exact qualified names
  bool on() const { return block > 0; }
};

struct EngineOptions {
  Strategy strategy = Strategy::FullShard;
  MixedPrecision mp;
  // Wrap policy: modules whose Module::name() is listed become units; with
  // min_num_params > 0, any hookable module whose not-yet-wrapped parameters reach
  // that count does too (bottom-up, like PyTorch's size-based policy).
  std::vector<std::string> wrap_types;
  int64_t min_num_params = 0;
  std::vector<std::string> ignored;          // parameter-name substrings kept whole, DDP-style
  BackwardPrefetch backward_prefetch = BackwardPrefetch::Pre;
  bool forward_prefetch = false;
  int limit_all_gathers = 2;                 // unshards in flight at once
  bool activation_checkpointing = false;     // recompute each block unit in backward
  // Where unsharded parameters, gradient buffers and the computation live: cpu, or a CUDA
  // device (needs a CUDA libtorch). Masters, gradient shards and optimizer state live there
  // too, unless cpu_offload.
  c10::Device device = c10::kCPU;
  // Masters, gradient shards and optimizer state in (pinned) host memory; each gather first
  // copies the shard host->device on a side stream, gradients come back device->host, and the
  // optimizer steps on the host (Kokkos). On a CPU device nothing moves, but the engine runs the
  // same flow (separate master and unsharded storages, staged gradients), with results equal to
  // the non-offloaded run's bit for bit.
  bool cpu_offload = false;
  // train.reproducible (docs/reproducibility.md): every micro-batch is one leaf of a fixed
  // binary tree over the global batch's leaves. Gradients are never accumulated in place; each
  // leaf's gradient is reduce-scattered by reduce_scatter_tree, summed over this rank's leaves
  // by a LeafSum, and across replicas by all_reduce_tree (Sum: the trainer scales the loss by
  // 1 / leaves); the gradient norm is an exact sum. Needs power-of-two groups, fp32 reduction
  // and a backend with tree collectives (MPI).
  bool reproducible = false;
  Compression compression;
  ReplicaSync replica_sync;
  // Whether a checkpoint (ckpt::view_snapshot / staged_snapshot) holds the frozen flats too: a
  // train.freeze run's checkpoint is the whole model; an adapter run's (LoRA) holds what trains
  // and identifies its base instead of storing it.
  bool checkpoint_frozen = true;
  Nf4Base nf4;
  // This rank's host (runtime::Topology::host_id): the byte counters split what each rank sends
  // into inside and between nodes by it. -1: unknown, everything counts as inside the node.
  int host_id = -1;
};

// ---- the strategy x option rules, each stated once --------------------------------------

// Which of the Compression options strategy s runs: quantized weight gathers need sharded
// weights (not no_shard), the quantized replica average needs replicas (the hybrid strategies),
// secondary shards are full_shard's (a hybrid shard group is the node already).
struct CompressionSupport {
  bool quantize_weights = false, quantize_grads = false, secondary_shards = false;
};
CompressionSupport compression_support(Strategy s);
// c with the options s does not run switched off (a probe of another strategy than the deck's).
Compression supported_compression(Strategy s, Compression c);

// A combination the engine does not run: the deck key, the value it was given (a TOML literal:
// true, "diloco", 8), and why (the text after "<key> = <value> ").
struct OptionConflict {
  std::string key, why;
  std::string value = "true";
  std::string message() const { return key + " = " + value + " " + why; }
};
// The first strategy x option combination of o (strategy, compression, replica_sync,
// cpu_offload, reproducible) the engine refuses, in a fixed order; nullopt when it runs. Rules
// that need the model (diloco.fragments <= units) are the engine's, at construction.
std::optional<OptionConflict> check_strategy_options(const EngineOptions& o);

// The groups strategy s shards and replicates over, on a world of world_size ranks whose mesh
// has shard groups of mesh_shard_size (runtime::mesh_shard_size): full_shard and shard_grad_op
// shard over the world, no_shard replicates over it, the hybrid strategies shard inside a mesh
// shard group and replicate across them (its replicate group). open_groups opens these
// communicators; the planner sizes its plans by them.
enum class GroupSpan { None, World, MeshShard, MeshReplicate };
struct StrategyGroups {
  GroupSpan shard = GroupSpan::None, replicate = GroupSpan::None;
  int shard_size = 1;      // ranks a flat is sharded over
  int replicate_size = 1;  // ranks holding the same shard (world_size / shard_size)
};
StrategyGroups strategy_groups(Strategy s, int world_size, int mesh_shard_size);

}  // namespace shardtrain::fsdp
