// `shardtrain ckpt inspect|verify|consolidate|export|import`: tools for checkpoint files.
#include <iostream>
#include <memory>

#include "command.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/train/import.h"
#include "shardtrain/util/error.h"

namespace shardtrain::cli {
namespace {

struct CkptArgs {
  std::string file, out, format = "safetensors";
  DeckArgs deck;
};

// Serial tools run on rank 0; run_agreed makes every rank end with rank 0's error.
int on_rank0(runtime::Runtime& rt, const std::function<void()>& fn) {
  runtime::run_agreed(rt.world(), [&] {
    if (rt.rank() == 0) fn();
  });
  return kExitOk;
}

void add_ckpt(CLI::App& app, CommandFn& selected) {
  auto* ck = app.add_subcommand("ckpt", "Inspect, verify, consolidate or export checkpoint files");
  ck->require_subcommand(1);
  auto a = std::make_shared<CkptArgs>();

  auto* inspect = ck->add_subcommand("inspect", "Print metadata, tensors and sizes of a checkpoint");
  inspect->add_option("FILE", a->file, "checkpoint (.h5)")->required();
  inspect->callback([&selected, a] {
    selected = [a](runtime::Runtime& rt) { return on_rank0(rt, [&] { ckpt::inspect_checkpoint(a->file, std::cout); }); };
  });

  auto* verify = ck->add_subcommand("verify", "Check completeness and every dataset's checksum (exit 0 ok, 2 bad)");
  verify->add_option("FILE", a->file, "checkpoint (.h5)")->required();
  verify->callback([&selected, a] {
    selected = [a](runtime::Runtime& rt) {
      ckpt::verify_checkpoint(a->file, rt.world());  // ranks split the reading
      if (rt.rank() == 0) std::cout << a->file << ": OK\n";
      return kExitOk;
    };
  });

  auto* cons = ck->add_subcommand("consolidate", "Write a serial copy of a checkpoint (after verifying it)");
  cons->add_option("FILE", a->file, "checkpoint (.h5)")->required();
  cons->add_option("OUT", a->out, "output .h5")->required();
  cons->callback([&selected, a] {
    selected = [a](runtime::Runtime& rt) { return on_rank0(rt, [&] { ckpt::consolidate_checkpoint(a->file, a->out); }); };
  });

  auto* exp = ck->add_subcommand("export", "Write the model parameters in another format");
  exp->add_option("FILE", a->file, "checkpoint (.h5)")->required();
  exp->add_option("OUT", a->out, "output file")->required();
  exp->add_option("--format", a->format, "output format")->check(CLI::IsMember({"safetensors"}));
  exp->callback([&selected, a] {
    selected = [a](runtime::Runtime& rt) { return on_rank0(rt, [&] { train::export_checkpoint(a->file, a->out); }); };
  });

  auto* imp = ck->add_subcommand(
      "import", "Shard a safetensors model into a step-0 checkpoint for a deck (run under mpirun: each rank reads only its slices)");
  imp->add_option("FILE", a->file, "input .safetensors (F32; Hugging Face names for GPT-2)")->required();
  imp->add_option("OUT", a->out, "output checkpoint (.h5)")->required();
  imp->add_option("--deck", a->deck.path, "the deck of the run that will train it (model, strategy)")->required();
  imp->add_option("--set", a->deck.overrides, "Override a deck key (repeatable)")->type_name("KEY=VALUE")->allow_extra_args(false);
  imp->callback([&selected, a] {
    selected = [a](runtime::Runtime& rt) {
      deck::Deck d = load_deck_agreed(a->deck, rt.world());
      train::import_safetensors(rt, d, a->file, a->out);
      return kExitOk;
    };
  });
}

}  // namespace
ST_REGISTER_COMMAND(ckpt, add_ckpt);
}  // namespace shardtrain::cli
