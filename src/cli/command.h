// Subcommand registry: each cmd_*.cpp adds its CLI11 subcommand and what it runs.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "shardtrain/deck/deck.h"
#include "shardtrain/runtime/runtime.h"

namespace shardtrain::cli {

// What a parsed subcommand runs, after MPI is up. Returns the exit code.
using CommandFn = std::function<int(runtime::Runtime&)>;
// Adds a subcommand to `app`; its callback stores the function to run into `selected`.
using AddCommandFn = void (*)(CLI::App& app, CommandFn& selected);

struct CommandRegistration {
  CommandRegistration(const char* name, AddCommandFn add);
};
const std::vector<std::pair<std::string, AddCommandFn>>& registered_commands();

#define ST_REGISTER_COMMAND(name, fn) \
  static ::shardtrain::cli::CommandRegistration st_register_##name(#name, fn)

// The deck arguments shared by subcommands that read a deck.
struct DeckArgs {
  std::string path;                 // empty: defaults only
  std::vector<std::string> overrides;
};
// Adds an optional positional DECK and repeatable --set KEY=VALUE.
void add_deck_args(CLI::App* sub, DeckArgs& args, bool deck_required);
// Loads the deck on every rank, agrees on failure, and checks that every rank resolved
// the same deck (hash); any problem ends all ranks with one message (exit 2).
deck::Deck load_deck_agreed(const DeckArgs& args, MPI_Comm comm);

// A line to print after a command-line error, or "": `KEY=VALUE` given as an argument (the
// jobscripts' form) is a deck override, which the binary takes as `--set KEY=VALUE`.
std::string parse_error_hint(const CLI::ParseError& e, int argc, char** argv);

}  // namespace shardtrain::cli
