// compression_from_deck: the fsdp.quantize_* keys (ZeRO++ qwZ / qgZ and the accuracy guard) read
// once, with the strategy x option combinations the engine does not run refused by name.
#include "shardtrain/deck/deck.h"
#include "shardtrain/fsdp/options.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"

namespace shardtrain::train {

fsdp::Compression compression_from_deck(const deck::Deck& d, fsdp::Strategy strategy) {
  fsdp::Compression c;
  c.quantize_weights = d.get_bool("fsdp.quantize_weights");
  c.quantize_grads = d.get_bool("fsdp.quantize_grads");
  c.block = d.get_int("fsdp.quant_block");
  c.guard_every = static_cast<int>(d.get_int("fsdp.quant_guard_every"));
  c.guard_threshold = d.get_float("fsdp.quant_guard_threshold");
  c.secondary_shards = d.get_bool("fsdp.secondary_shards");
  const std::string s = fsdp::to_string(strategy);
  auto refuse = [&](const char* key, const std::string& why) {
    throw UserError(d.origin(key) + ": " + key + " = true " + why);
  };
  if (c.quantize_weights && strategy == fsdp::Strategy::NoShard)
    refuse("fsdp.quantize_weights", "needs sharded weights to gather; parallel.strategy = no_shard gathers none");
  if (c.quantize_grads && !fsdp::is_hybrid(strategy))
    refuse("fsdp.quantize_grads",
           "quantizes the gradient average across replicas, which only hybrid_shard and hybrid_shard_zero2 have "
           "(parallel.strategy = " + s + ")");
  if (c.secondary_shards && strategy != fsdp::Strategy::FullShard)
    refuse("fsdp.secondary_shards",
           "keeps a node-local shard after forward instead of freeing to the global shard: full_shard only "
           "(parallel.strategy = " + s + (fsdp::is_hybrid(strategy) ? ", whose shard group is the node already)" : ")"));
  if (c.secondary_shards && d.get_bool("fsdp.cpu_offload"))
    refuse("fsdp.secondary_shards", "does not run with fsdp.cpu_offload = true");
  for (const char* key : {"fsdp.quantize_weights", "fsdp.quantize_grads"}) {
    if (!d.get_bool(key)) continue;
    if (d.get_bool("fsdp.cpu_offload"))
      refuse(key, "does not run with fsdp.cpu_offload = true (the quantized collectives work on device shards)");
    // Quantization blocks follow the shards (so the world size), and the guard's fallback a
    // measured error: neither goes with train.reproducible's same bits at every world size.
    if (d.get_bool("train.reproducible"))
      refuse(key, "is lossy and its blocks follow the shards: not with train.reproducible = true");
  }
  return c;
}

}  // namespace shardtrain::train
