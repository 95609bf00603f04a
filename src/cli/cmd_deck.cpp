// `shardtrain deck reference|check|show`: the deck reference, and validating or printing a deck.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "shardtrain/deck/deck.h"
#include "shardtrain/model/hf_config.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/file_io.h"

namespace shardtrain::cli {
namespace {

struct DeckCommandArgs {
  std::string reference_out;  // "" = stdout
  bool reference_json = false;
  DeckArgs check, show;
};

// Provenance as TOML comments, so a saved `deck show` says where it came from.
void print_resolved(const DeckArgs& args, const deck::Deck& d) {
  std::cout << "# deck: " << args.path << "\n";
  for (const auto& o : args.overrides) std::cout << "# --set " << o << "\n";
  std::cout << d.resolved_toml();
}

// The model the deck resolves to, every field, as TOML comments: with model.from_hf (or an
// init_from directory) most of it comes from a config.json, not from the keys shown above.
void print_model(const deck::Deck& d, const model::ModelSpec& spec) {
  const std::string hf = train::hf_model_source(d);
  std::cout << "\n# resolved model" << (hf.empty() ? std::string() : " (from " + model::hf_config_path(hf) + ")")
            << ": " << model::parameter_count(spec) << " parameters\n# arch = \"" << spec.arch << "\"\n";
  const bool images = model::input_kind(spec) == model::InputKind::Images;
  for (const model::SpecField& f : model::spec_fields()) {
    if ((f.images_only && !images) || (f.llama_only && spec.arch != "llama")) continue;
    std::cout << "# " << f.name << " = ";
    if (f.int_field) std::cout << spec.*f.int_field;
    if (f.float_field) std::cout << nlohmann::json(spec.*f.float_field).dump();
    if (f.bool_field) std::cout << (spec.*f.bool_field ? "true" : "false");
    if (f.string_field) std::cout << nlohmann::json(spec.*f.string_field).dump();
    std::cout << "\n";
  }
}

// The schema as JSON, for scripts that must agree with this binary (jobscripts/scaling-study
// reads parallel.strategy's choices from it): {"keys": [{"key", "type", "default", "choices",
// "unit", "help"}, ...]}.
std::string reference_json() {
  nlohmann::json keys = nlohmann::json::array();
  for (const auto& k : deck::schema()) {
    nlohmann::json j;
    j["key"] = k.key;
    j["type"] = deck::to_string(k.type);
    std::visit([&](const auto& v) { j["default"] = v; }, k.default_value);
    j["choices"] = k.choices;
    j["unit"] = k.unit;
    j["help"] = k.help;
    keys.push_back(std::move(j));
  }
  return nlohmann::json{{"keys", keys}}.dump(1) + "\n";
}

int run_reference(runtime::Runtime& rt, const std::string& out, bool json) {
  // Only rank 0 writes, but a failure must end every rank with the same message.
  runtime::run_agreed(rt.world(), [&] {
    if (rt.rank() != 0) return;
    if (!out.empty()) io::check_output_writable(out, "deck reference --output");
    const std::string md = json ? reference_json() : deck::reference_markdown();
    if (out.empty()) {
      std::cout << md << std::flush;
      return;
    }
    io::write_file_atomic(out, md);  // never through a planted link (util/file_io.h)
  });
  return kExitOk;
}

int run_check(runtime::Runtime& rt, const DeckArgs& args) {
  deck::Deck d = load_deck_agreed(args, rt.world());
  // The model's own shape rules too (e.g. a ViT's patch_size must tile image_size), what trains
  // (LoRA's targets and rank, train.freeze, lora.train_also: build_model applies them to the
  // model on meta, as train does), and the run's rules `train` applies with the same function
  // (strategy, DiLoCo, optimizer, schedule), and the data rules.
  model::ModelSpec spec;
  runtime::run_agreed(rt.world(), [&] {
    spec = train::model_spec_from_deck(d);
    model::build_model(spec, at::kMeta);
    train::check_run_rules(d);
    train::check_data_rules(d, spec);
  });
  if (rt.rank() == 0) {
    print_resolved(args, d);
    print_model(d, spec);
    size_t set = 0;
    for (const auto& k : deck::schema()) set += d.is_set(k.key) ? 1 : 0;
    char hash[32];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(d.hash()));
    std::cout << "\n# valid deck: " << set << " of " << deck::schema().size() << " keys set, hash " << hash
              << "\n" << std::flush;
  }
  return kExitOk;
}

int run_show(runtime::Runtime& rt, const DeckArgs& args) {
  deck::Deck d = load_deck_agreed(args, rt.world());
  model::ModelSpec spec;
  runtime::run_agreed(rt.world(), [&] { spec = train::model_spec_from_deck(d); });
  if (rt.rank() == 0) {
    print_resolved(args, d);
    print_model(d, spec);
    std::cout << std::flush;
  }
  return kExitOk;
}

void add_deck_command(CLI::App& app, CommandFn& selected) {
  static DeckCommandArgs args;
  CLI::App* cmd = app.add_subcommand("deck", "Input decks: the key reference, checking and showing a deck");
  cmd->require_subcommand(1);

  CLI::App* reference = cmd->add_subcommand("reference", "Print the reference of every deck key (Markdown)");
  reference->add_option("-o,--output", args.reference_out, "Write it to this file instead of stdout");
  reference->add_flag("--json", args.reference_json, "The schema as JSON (key, type, default, choices, unit, help)");
  reference->callback([&selected] {
    selected = [](runtime::Runtime& rt) { return run_reference(rt, args.reference_out, args.reference_json); };
  });

  CLI::App* check = cmd->add_subcommand(
      "check", "Validate a deck (and overrides) and print it resolved; exit code 2 if it is invalid");
  add_deck_args(check, args.check, /*deck_required=*/true);
  check->callback([&selected] {
    selected = [](runtime::Runtime& rt) { return run_check(rt, args.check); };
  });

  CLI::App* show = cmd->add_subcommand("show", "Print the resolved deck: every key, defaults included");
  add_deck_args(show, args.show, /*deck_required=*/true);
  show->callback([&selected] {
    selected = [](runtime::Runtime& rt) { return run_show(rt, args.show); };
  });
}

}  // namespace

ST_REGISTER_COMMAND(deck, add_deck_command);

}  // namespace shardtrain::cli
