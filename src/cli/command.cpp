// Command registry and the deck loading shared by subcommands.
#include "command.h"

#include <algorithm>
#include <cstring>

#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/util/error.h"

namespace shardtrain::cli {
namespace {
std::vector<RegisteredCommand>& registry() {
  static std::vector<RegisteredCommand> r;
  return r;
}
}  // namespace

CommandRegistration::CommandRegistration(const char* word, AddCommandFn add, CommandNeeds needs) {
  auto& r = registry();
  r.push_back({word, add, needs});
  std::stable_sort(r.begin(), r.end(), [](auto& a, auto& b) { return a.word < b.word; });
}
const std::vector<RegisteredCommand>& registered_commands() { return registry(); }

CommandBeforeMpi command_before_mpi(int argc, char** argv) {
  CommandBeforeMpi c;
  for (int i = 1; i < argc && c.word.empty(); ++i)
    if (argv[i][0] != '-') c.word = argv[i];
  auto on_argv = [&](const char* flag) {
    for (int i = 1; i < argc; ++i)
      if (std::strcmp(argv[i], flag) == 0) return true;
    return false;
  };
  // Help computes nothing (and must not wait for a BLAS benchmark before printing).
  if (on_argv("--help") || on_argv("-h")) return c;
  for (const RegisteredCommand& r : registry()) {
    if (r.word != c.word) continue;
    c.computes = c.computes || r.needs.computes || (r.needs.computes_with && on_argv(r.needs.computes_with));
    c.prints_kernel = c.prints_kernel || r.needs.prints_kernel;
    c.early_stop_signals = c.early_stop_signals || r.needs.early_stop_signals;
  }
  return c;
}

void add_deck_args(CLI::App* sub, DeckArgs& args, bool deck_required) {
  auto* opt = sub->add_option("deck", args.path, "Input deck (TOML); see docs/deck-reference.md");
  if (deck_required) opt->required();
  sub->add_option("--set", args.overrides,
                  "Override a deck key, e.g. --set optimizer.lr=3e-4 (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
}

deck::Deck load_deck_agreed(const DeckArgs& args, MPI_Comm comm) {
  deck::Deck d = deck::Deck::defaults();
  runtime::run_agreed(comm, [&] {
    d = args.path.empty() ? deck::Deck::defaults(args.overrides)
                          : deck::Deck::load(args.path, args.overrides);
  });
  // Every rank must have read the same deck (a stale copy on one node is a classic).
  const bool same = runtime::all_equal(comm, d.hash(), "deck.hash");
  runtime::run_agreed(comm, [&] {
    ST_USER_CHECK(same, "the ranks read different decks from '", args.path,
                  "' (resolved-deck hashes differ): is the file identical on every node?");
  });
  return d;
}

std::string parse_error_hint(const CLI::ParseError& e, int argc, char** argv) {
  if (!dynamic_cast<const CLI::ExtrasError*>(&e)) return "";
  std::string sets;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool after_set = i > 1 && std::string(argv[i - 1]) == "--set";
    if (!after_set && !a.empty() && a[0] != '-' && a.find('=') != std::string::npos && a.find('.') < a.find('='))
      sets += " --set " + a;
  }
  return sets.empty() ? "" : "hint: deck keys are set with --set KEY=VALUE:" + sets;
}

}  // namespace shardtrain::cli
