// Deck -> the planner's settings (plan/settings.h): the deck's model, engine options, optimizer and
// batch, read by the same functions a training run reads them with (setup.h).
#pragma once
#include "shardtrain/deck/deck.h"
#include "shardtrain/plan/settings.h"

namespace shardtrain::train {

// Reads model.*, fsdp.*, optimizer.*, train.* and parallel.shard_group_size from a deck.
// ranks / ranks_per_host are the caller's (CLI flags).
plan::PlanSettings plan_settings_from_deck(const deck::Deck& d, int ranks, int ranks_per_host);

}  // namespace shardtrain::train
