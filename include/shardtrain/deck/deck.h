// Deck: a validated, resolved TOML input deck (schema in src/deck/schema.cpp).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace shardtrain::deck {

// Bounds on a deck file, checked before toml++ sees it: decks are a few kilobytes, and a
// legal deck nests at most 3 levels ([section], key, a list or inline table as the value).
inline constexpr std::uint64_t kMaxDeckFileBytes = std::uint64_t{1} << 20;  // 1 MiB
inline constexpr int kMaxDeckNesting = 8;  // tables + dotted-key segments + arrays + inline tables
// Static caps of run.threads / optimizer.host_threads and of rank-count keys; the machine's
// own thread cap (4 x its CPUs) is checked when a run starts (train::threads_per_rank).
inline constexpr int kMaxThreads = 4096;
inline constexpr int kMaxRanks = 1 << 20;

enum class Type { Int, Float, Bool, String, StringList };
const char* to_string(Type t);

using Value = std::variant<int64_t, double, bool, std::string, std::vector<std::string>>;

// One key of the schema: every key has a type, a default, its allowed range or values,
// a unit where one applies and a one-line description.
struct KeySpec {
  std::string key;                    // "section.name"
  Type type;
  Value default_value;
  std::string help;                   // one line
  std::string unit;                   // "" when none ("s", "bytes", "tokens", ...)
  std::vector<std::string> choices;   // String: allowed values ("" = any)
  bool has_min = false, has_max = false;
  double min = 0, max = 0;            // Int/Float range, inclusive
  bool min_exclusive = false, max_exclusive = false;  // makes that bound strict (> or <)
  bool non_empty = false;             // String: "" is not allowed
  // String: a relative path that must stay inside this base (named for messages: "runs/",
  // "run.out_dir"); "" = not a path key. Checked by path_escape_reason (util/path_inside.h).
  std::string inside;
};

// One [section] of a deck, in documentation order.
struct SectionSpec {
  std::string name;
  std::string help;                   // one line
};
const std::vector<SectionSpec>& sections();

// All keys, in documentation order.
const std::vector<KeySpec>& schema();
const KeySpec* find_key(const std::string& key);
// Gives a string key the allowed values a higher layer owns (model.arch: the model layer's
// architectures). Call once at start-up, before any deck is read (not thread-safe).
void set_choices(const std::string& key, std::vector<std::string> choices);

class Deck {
 public:
  // Reads and validates a deck file, then applies overrides "section.key=value".
  // Any problem throws UserError naming the file (and line) or the override.
  static Deck load(const std::string& path, const std::vector<std::string>& overrides = {});
  static Deck parse(const std::string& text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});
  // Defaults only (plus overrides).
  static Deck defaults(const std::vector<std::string>& overrides = {});

  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  const std::vector<std::string>& get_string_list(const std::string& key) const;
  bool is_set(const std::string& key) const;  // given in the file or an override
  // Where the value came from, for messages: "deck.toml:12:1", "--set a.b=v" or "default".
  std::string origin(const std::string& key) const;
  // Every key's value (defaults included), keyed by "section.name".
  const std::map<std::string, Value>& values() const { return values_; }

  // Output paths with their "" defaults resolved: run.out_dir ("" = runs/<run.name>) and
  // checkpoint.dir ("" = <out_dir>/checkpoints). The resolved deck is saved as
  // <out_dir>/deck.resolved.toml.
  std::string out_dir() const;
  std::string checkpoint_dir() const;

  // The fully resolved deck (defaults included) as TOML, one comment per key.
  std::string resolved_toml() const;
  // FNV-1a 64 of resolved_toml(): ranks compare it to make sure they read the same deck.
  uint64_t hash() const;
  const std::string& source() const { return source_; }

 private:
  static Deck from_schema();
  void set_value(const std::string& key, Value v, std::string origin);
  void apply_override(const std::string& assignment);
  void check_relations() const;  // rules that involve several keys

  std::map<std::string, Value> values_;
  std::map<std::string, bool> set_;
  std::map<std::string, std::string> origin_;
  std::string source_;
};

// Markdown reference of every key (docs/deck-reference.md is generated from it).
std::string reference_markdown();

}  // namespace shardtrain::deck
