// The training job: deck in, trained model, metrics and checkpoints out.
#pragma once
#include "shardtrain/deck/deck.h"
#include "shardtrain/runtime/runtime.h"

namespace shardtrain::train {

// Runs `shardtrain train`. Collective over the world. Returns the process exit code:
// 0 finished, kExitCheckpointed (42) stopped on SIGUSR1/SIGTERM after a checkpoint.
int run_training(runtime::Runtime& rt, const deck::Deck& deck);

}  // namespace shardtrain::train
