// What `train` tells the console at start: the deck in one screen (the full resolved deck goes
// to <run.out_dir>/deck.resolved.toml), and the note of a run that has nothing left to train.
#pragma once
#include <string>

#include "loop_settings.h"
#include "shardtrain/deck/deck.h"
#include "shardtrain/train/resume_state.h"

namespace shardtrain::train {

// "# shardtrain train: DECK ..." lines: the keys the deck and --set give, where the resolved
// deck is written, and how to print it all (log.print_deck); the whole resolved deck after
// them when log.print_deck = true. No final newline (for log::info).
std::string start_summary(const deck::Deck& d, const std::string& out_dir);

// True when a resumed position has reached train.max_steps or train.max_tokens.
bool nothing_left(const LoopPosition& pos, const TrainerSettings& s);

// The console note for a resumed run with nothing left to train: where it stands, that no
// file was changed, and the two ways on (train further; start a new run).
std::string nothing_to_train_note(const LoopPosition& pos, const TrainerSettings& s,
                                  const std::string& checkpoint);

}  // namespace shardtrain::train
