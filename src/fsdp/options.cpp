// Parsing and naming of FSDP options.
#include "shardtrain/fsdp/options.h"

#include <utility>

#include "shardtrain/comm/dtype.h"
#include "shardtrain/util/choices.h"
#include "shardtrain/util/error.h"

namespace shardtrain::fsdp {

// The enum's order is choices::kStrategies' order.
static_assert(static_cast<int>(Strategy::HybridShardZero2) + 1 == static_cast<int>(choices::kStrategies.size()));

Strategy parse_strategy(const std::string& s) {
  return choices::parse_choice<Strategy>(choices::kStrategies, s, "parallel.strategy");
}

const char* to_string(Strategy s) {
  const int i = static_cast<int>(s);
  return i >= 0 && i < static_cast<int>(choices::kStrategies.size()) ? choices::kStrategies[i] : "?";
}

// The enum's order is choices::kBackwardPrefetch's order (the deck schema's allowed values).
static_assert(static_cast<int>(BackwardPrefetch::None) + 1 == static_cast<int>(choices::kBackwardPrefetch.size()));

BackwardPrefetch parse_backward_prefetch(const std::string& s) {
  return choices::parse_choice<BackwardPrefetch>(choices::kBackwardPrefetch, s, "fsdp.backward_prefetch");
}

at::ScalarType parse_dtype(const std::string& s) {
  // The deck's dtypes (choices::kDtypes), by their short or torch's long name (comm/dtype.h).
  const std::optional<at::ScalarType> t = comm::dtype_from_name(s, /*with_alias=*/false);
  if (!t || choices::index_of(choices::kDtypes, comm::dtype_short_name(*t)) < 0)
    throw UserError("unknown dtype '" + s + "' (" + choices::joined(choices::kDtypes) + ")");
  return *t;
}

const char* dtype_name(at::ScalarType t) { return comm::dtype_short_name(t); }

static_assert(static_cast<int>(ReplicaSyncMode::DiLoCo) + 1 == static_cast<int>(choices::kReplicaSync.size()));

ReplicaSyncMode parse_replica_sync(const std::string& s) {
  return choices::parse_choice<ReplicaSyncMode>(choices::kReplicaSync, s, "parallel.replica_sync");
}

int fragment_of_unit(int unit, int units, int fragments) {
  return static_cast<int>(static_cast<int64_t>(unit) * fragments / units);
}

void check_fragments(int fragments, int units) {
  if (fragments < 1 || fragments > units)
    throw UserError("diloco.fragments = " + std::to_string(fragments) + " exceeds the " + std::to_string(units) +
                    " units of this model (fsdp.wrap decides them): a fragment is one or more whole units");
}

bool is_hybrid(Strategy s) { return s == Strategy::HybridShard || s == Strategy::HybridShardZero2; }
bool reshards_after_forward(Strategy s) { return s == Strategy::FullShard || s == Strategy::HybridShard; }

CompressionSupport compression_support(Strategy s) {
  CompressionSupport ok;
  ok.quantize_weights = s != Strategy::NoShard;
  ok.quantize_grads = is_hybrid(s);
  ok.secondary_shards = s == Strategy::FullShard;
  return ok;
}

Compression supported_compression(Strategy s, Compression c) {
  const CompressionSupport ok = compression_support(s);
  c.quantize_weights = c.quantize_weights && ok.quantize_weights;
  c.quantize_grads = c.quantize_grads && ok.quantize_grads;
  c.secondary_shards = c.secondary_shards && ok.secondary_shards;
  return c;
}

namespace {

// parallel.replica_sync = "diloco" and the [diloco] keys against the strategy and the options.
std::optional<OptionConflict> check_replica_sync(const EngineOptions& o) {
  const ReplicaSync& rs = o.replica_sync;
  if (!rs.diloco()) return std::nullopt;
  const std::string diloco = "\"diloco\"";
  if (!is_hybrid(o.strategy))
    return OptionConflict{"parallel.replica_sync",
                          "needs replicas that train apart and a shard group inside each: hybrid_shard or "
                          "hybrid_shard_zero2 (parallel.strategy = " + std::string(to_string(o.strategy)) + ")",
                          diloco};
  if (o.compression.quantize_grads)
    return OptionConflict{"fsdp.quantize_grads",
                          "quantizes the per-step gradient average across replicas, which parallel.replica_sync = "
                          "\"diloco\" does not run (nothing crosses between replicas between outer steps); "
                          "diloco.outer_dtype = \"int8\" quantizes the outer gradients instead"};
  if (rs.overlap_steps > 0 && rs.overlap_steps >= rs.inner_steps / rs.fragments)
    return OptionConflict{"diloco.overlap_steps",
                          "must be below diloco.inner_steps / diloco.fragments = " +
                              std::to_string(rs.inner_steps / rs.fragments) +
                              " (a fragment's average lands before the next fragment's sync)",
                          std::to_string(rs.overlap_steps)};
  if (rs.outer_dtype != WireFormat::Fp32 && o.reproducible)
    // bf16 rounds on the wire; int8 / int4 quantize in blocks cut from each rank's shard, whose
    // bounds move with the shard group's size: neither gives the same bits at another world size.
    return OptionConflict{"diloco.outer_dtype",
                          "rounds the outer gradients on the wire: train.reproducible sums them in fp32 in a fixed "
                          "tree (diloco.outer_dtype = \"fp32\")",
                          "\"" + std::string(choices::kOuterDtypes.at(static_cast<size_t>(rs.outer_dtype))) + "\""};
  return std::nullopt;
}

}  // namespace

std::optional<OptionConflict> check_strategy_options(const EngineOptions& o) {
  const Compression& c = o.compression;
  const CompressionSupport ok = compression_support(o.strategy);
  const std::string s = to_string(o.strategy);
  if (c.quantize_weights && !ok.quantize_weights)
    return OptionConflict{"fsdp.quantize_weights",
                          "needs sharded weights to gather; parallel.strategy = no_shard gathers none"};
  if (c.quantize_grads && !ok.quantize_grads)
    return OptionConflict{"fsdp.quantize_grads",
                          "quantizes the gradient average across replicas, which only hybrid_shard and "
                          "hybrid_shard_zero2 have (parallel.strategy = " + s + ")"};
  if (c.secondary_shards && !ok.secondary_shards)
    return OptionConflict{"fsdp.secondary_shards",
                          "keeps a node-local shard after forward instead of freeing to the global shard: full_shard "
                          "only (parallel.strategy = " + s +
                              (is_hybrid(o.strategy) ? ", whose shard group is the node already)" : ")")};
  if (c.secondary_shards && o.cpu_offload)
    return OptionConflict{"fsdp.secondary_shards", "does not run with fsdp.cpu_offload = true"};
  if (const auto bad = check_replica_sync(o)) return bad;
  for (const auto& [on, key] : {std::pair{c.quantize_weights, "fsdp.quantize_weights"},
                                std::pair{c.quantize_grads, "fsdp.quantize_grads"}}) {
    if (!on) continue;
    if (o.cpu_offload)
      return OptionConflict{key, "does not run with fsdp.cpu_offload = true (the quantized collectives work on "
                                 "device shards)"};
    // Quantization blocks follow the shards (so the world size), and the guard's fallback a
    // measured error: neither goes with train.reproducible's same bits at every world size.
    if (o.reproducible)
      return OptionConflict{key, "is lossy and its blocks follow the shards: not with train.reproducible = true"};
  }
  return std::nullopt;
}

StrategyGroups strategy_groups(Strategy s, int world_size, int mesh_shard_size) {
  StrategyGroups g;
  if (is_hybrid(s)) {
    g.shard = GroupSpan::MeshShard;
    g.replicate = GroupSpan::MeshReplicate;
    g.shard_size = mesh_shard_size;
  } else if (s == Strategy::NoShard) {
    g.replicate = GroupSpan::World;
    g.shard_size = 1;
  } else {
    g.shard = GroupSpan::World;
    g.shard_size = world_size;
  }
  g.replicate_size = g.shard_size > 0 ? world_size / g.shard_size : 0;
  return g;
}

}  // namespace shardtrain::fsdp
