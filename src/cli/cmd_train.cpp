// `shardtrain train DECK`: the main job.
#include "command.h"
#include "shardtrain/train/trainer.h"

namespace shardtrain::cli {
namespace {
void add_train(CLI::App& app, CommandFn& selected) {
  auto* sub = app.add_subcommand("train", "Train the model a deck describes (run it under mpirun or srun)");
  auto args = std::make_shared<DeckArgs>();
  add_deck_args(sub, *args, true);
  sub->callback([&selected, args] {
    selected = [args](runtime::Runtime& rt) {
      const auto watch = train::watch_world_from_start(rt.world());
      deck::Deck d = load_deck_agreed(*args, rt.world());
      return train::run_training(rt, d, *watch);
    };
  });
}
}  // namespace
ST_REGISTER_COMMAND_NEEDS(train, "train", add_train, [] {
  CommandNeeds n = computing();
  n.early_stop_signals = true;
  return n;
}());
}  // namespace shardtrain::cli
