// The training job: deck in, trained model, metrics and checkpoints out.
#pragma once
#include <memory>

#include "shardtrain/comm/watch_regions.h"
#include "shardtrain/deck/deck.h"
#include "shardtrain/runtime/runtime.h"

namespace shardtrain::train {

// The world's exchanges watched from `train`'s first one (the deck's own agreement) under the
// schema's default comm.timeout_s; run_training sets the deck's. Collective over the world.
std::unique_ptr<comm::RegionWatch> watch_world_from_start(MPI_Comm world);

// Runs `shardtrain train`. Collective over the world. Returns the process exit code:
// 0 finished, kExitCheckpointed (42) stopped on SIGUSR1/SIGTERM after a checkpoint.
int run_training(runtime::Runtime& rt, const deck::Deck& deck, comm::RegionWatch& watch_world);

}  // namespace shardtrain::train
