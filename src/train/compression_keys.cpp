// compression_from_deck: the fsdp.quantize_* keys (ZeRO++ qwZ / qgZ and the accuracy guard) read
// once, with the strategy x option combinations the engine does not run refused by name;
// replica_sync_from_deck: parallel.replica_sync and the [diloco] section (DiLoCo), whose rules
// against the strategy and the compression keys are checked here too.
#include <optional>

#include "shardtrain/deck/deck.h"
#include "shardtrain/fsdp/options.h"
#include "shardtrain/fsdp/quantize.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"

namespace shardtrain::train {

fsdp::ReplicaSync replica_sync_from_deck(const deck::Deck& d) {
  fsdp::ReplicaSync rs;
  rs.mode = fsdp::parse_replica_sync(d.get_string("parallel.replica_sync"));
  rs.inner_steps = d.get_int("diloco.inner_steps");
  rs.outer_lr = d.get_float("diloco.outer_lr");
  rs.outer_momentum = d.get_float("diloco.outer_momentum");
  rs.nesterov = d.get_bool("diloco.nesterov");
  rs.fragments = static_cast<int>(d.get_int("diloco.fragments"));
  rs.overlap_steps = d.get_int("diloco.overlap_steps");
  rs.outer_dtype = fsdp::parse_wire_format(d.get_string("diloco.outer_dtype"));
  return rs;
}

fsdp::Compression compression_from_deck(const deck::Deck& d, fsdp::Strategy strategy) {
  fsdp::Compression c;
  c.quantize_weights = d.get_bool("fsdp.quantize_weights");
  c.quantize_grads = d.get_bool("fsdp.quantize_grads");
  c.block = d.get_int("fsdp.quant_block");
  c.guard_every = static_cast<int>(d.get_int("fsdp.quant_guard_every"));
  c.guard_threshold = d.get_float("fsdp.quant_guard_threshold");
  c.secondary_shards = d.get_bool("fsdp.secondary_shards");
  // The engine's rule (fsdp::check_strategy_options), with the deck key's origin.
  fsdp::EngineOptions o;
  o.strategy = strategy;
  o.compression = c;
  o.cpu_offload = d.get_bool("fsdp.cpu_offload");
  o.reproducible = d.get_bool("train.reproducible");
  o.replica_sync = replica_sync_from_deck(d);
  if (const std::optional<fsdp::OptionConflict> no = fsdp::check_strategy_options(o))
    throw UserError(d.origin(no->key) + ": " + no->message());
  return c;
}

}  // namespace shardtrain::train
