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

// What a command needs before MPI starts, declared where it registers: main() finds the command
// word on the command line (command_before_mpi) before CLI11 parses anything.
struct CommandNeeds {
  // Runs matmuls: the best GEMM kernel the CPU has is selected before MPI_Init and the first BLAS
  // call (runtime/blas_kernel.h). `computes_with`: only when this flag is given (plan --measure).
  bool computes = false;
  const char* computes_with = nullptr;
  bool prints_kernel = false;       // the command reports the kernel itself (info): no start-up line
  bool early_stop_signals = false;  // SIGUSR1/SIGTERM recorded from the first instruction (train)
};
inline CommandNeeds computing() { return CommandNeeds{true, nullptr, false, false}; }
inline CommandNeeds computing_with(const char* flag) { return CommandNeeds{false, flag, false, false}; }

struct RegisteredCommand {
  std::string word;  // the subcommand as typed ("bench" for every bench command)
  AddCommandFn add;
  CommandNeeds needs;
};
struct CommandRegistration {
  CommandRegistration(const char* word, AddCommandFn add, CommandNeeds needs = {});
};
// Sorted by word (the order CLI11 lists them in).
const std::vector<RegisteredCommand>& registered_commands();

// The command on argv (its first word that is not a flag) and what it needs before MPI starts.
struct CommandBeforeMpi {
  std::string word;                 // "" when there is none
  bool computes = false;            // CommandNeeds::computes, or its computes_with flag is on argv
  bool prints_kernel = false;
  bool early_stop_signals = false;
};
CommandBeforeMpi command_before_mpi(int argc, char** argv);

// name: a unique identifier of the registration; word: the subcommand it adds.
#define ST_REGISTER_COMMAND(name, fn) \
  static ::shardtrain::cli::CommandRegistration st_register_##name(#name, fn)
#define ST_REGISTER_COMMAND_NEEDS(name, word, fn, needs) \
  static ::shardtrain::cli::CommandRegistration st_register_##name(word, fn, needs)

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
