// `shardtrain ckpt inspect|verify|consolidate|export|import`: tools for checkpoint files.
#include <iostream>
#include <memory>

#include "command.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/model/hf_config.h"
#include "shardtrain/model_io/import.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/byte_size.h"
#include "shardtrain/util/error.h"

namespace shardtrain::cli {
namespace {

struct CkptArgs {
  std::string file, out, format = "safetensors";
  std::string dtype = "auto", max_shard_size = "5GB", tokenizer_from;
  bool allow_overflow = false;
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

  auto* exp = ck->add_subcommand("export", "Write the model parameters in another format (a safetensors file, or a Hugging Face directory)");
  exp->add_option("FILE", a->file, "checkpoint (.h5)")->required();
  exp->add_option("OUT", a->out, "output file (safetensors) or directory (hf: absent or empty)")->required();
  exp->add_option("--format", a->format,
                  "safetensors (one F32 file); hf (config.json, model.safetensors or shards + index, "
                  "generation_config.json, the source's tokenizer files; a LoRA checkpoint merged into its base, "
                  "each rank merging its rows under mpirun); or peft (a LoRA checkpoint as a PEFT adapter directory)")
      ->check(CLI::IsMember({"safetensors", "hf", "peft"}));
  exp->add_option("--dtype", a->dtype, "hf: tensor dtype; auto = bf16 for a bf16 run, else the source's torch_dtype, else fp32")
      ->check(CLI::IsMember({"auto", "fp32", "bf16", "fp16"}));
  exp->add_flag("--allow-overflow", a->allow_overflow,
               "hf: write values beyond the dtype's range (fp16: 65504) as its largest value instead of refusing them");
  exp->add_option("--max-shard-size", a->max_shard_size, "hf: largest safetensors file (tensor bytes), e.g. 5GB, 500MB, 2GiB");
  exp->add_option("--tokenizer-from", a->tokenizer_from,
                  "hf: directory whose tokenizer files are copied (default: the model's model.from_hf / init_from directory)");
  exp->callback([&selected, a] {
    selected = [a](runtime::Runtime& rt) -> int {
      model_io::HfExportOptions o;
      bool adapter = false;
      runtime::run_agreed(rt.world(), [&] {
        o.dtype = a->dtype;
        o.allow_overflow = a->allow_overflow;
        o.max_shard_bytes = parse_byte_size(a->max_shard_size, "--max-shard-size");
        o.tokenizer_from = a->tokenizer_from;
        adapter = a->format == "hf" && model_io::is_adapter_checkpoint(a->file);
      });
      // A LoRA checkpoint merged into its base: every rank merges and writes its rows.
      if (adapter) {
        model_io::export_merged_hf_directory(rt.world(), a->file, a->out, o);
        return kExitOk;
      }
      return on_rank0(rt, [&] {
        if (a->format == "hf") model_io::export_hf_directory(a->file, a->out, o);
        else if (a->format == "peft") model_io::export_peft_directory(a->file, a->out);
        else model_io::export_checkpoint(a->file, a->out);
      });
    };
  });

  auto* imp = ck->add_subcommand(
      "import", "Shard a safetensors model into a step-0 checkpoint for a deck (run under mpirun: each rank reads only its slices)");
  imp->add_option("FILE", a->file,
                  "input: a .safetensors file, an index .json, or a model directory (a Hugging Face directory's "
                  "config.json gives the model)")
      ->required();
  imp->add_option("OUT", a->out, "output checkpoint (.h5)")->required();
  imp->add_option("--deck", a->deck.path,
                  "the deck of the run that will train it (model, strategy); optional when FILE is a directory with a "
                  "config.json");
  imp->add_option("--set", a->deck.overrides, "Override a deck key (repeatable)")->type_name("KEY=VALUE")->allow_extra_args(false);
  imp->callback([&selected, a] {
    selected = [a](runtime::Runtime& rt) {
      deck::Deck d = load_deck_agreed(a->deck, rt.world());
      // A Hugging Face directory brings its model unless the deck names one itself.
      bool hf = false;
      runtime::run_agreed(rt.world(), [&] {
        hf = train::hf_model_source(d).empty() && model::has_hf_config(a->file);
        ST_USER_CHECK(hf || !a->deck.path.empty() || !train::hf_model_source(d).empty(), "ckpt import: ", a->file,
                      " has no config.json: give the model with --deck DECK (or --set model.from_hf=DIR)");
      });
      // A LoRA deck: FILE is the base its adapters are trained on (an adapter checkpoint's deck
      // names its base in checkpoint.init_from).
      bool lora = false;
      runtime::run_agreed(rt.world(), [&] { lora = d.get_int("lora.rank") > 0 || !d.get_string("lora.init_from").empty(); });
      if (hf || lora) {
        DeckArgs with = a->deck;
        if (hf) with.overrides.push_back("model.from_hf=" + a->file);
        if (lora) with.overrides.push_back("checkpoint.init_from=" + a->file);
        d = load_deck_agreed(with, rt.world());
      }
      model_io::import_safetensors(rt, d, a->file, a->out);
      return kExitOk;
    };
  });
}

}  // namespace
ST_REGISTER_COMMAND(ckpt, add_ckpt);
}  // namespace shardtrain::cli
