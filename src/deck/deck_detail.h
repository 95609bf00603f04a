// Helpers shared by the deck's readers (file, overrides) and printers (resolved deck, reference).
#pragma once
#include <string>
#include <string_view>

#include "shardtrain/deck/deck.h"

namespace shardtrain::deck::detail {

// "an integer", "a float", ... for messages like "expected an integer".
const char* type_phrase(Type t);
// "" when v satisfies the key's range, choices and non-emptiness; otherwise why not,
// e.g. "must be >= 1, got 0" or "must be one of: a, b; got 'c'".
std::string check_value(const KeySpec& spec, const Value& v);
// " (did you mean 'optimizer.lr'?)" for the valid key nearest to `key`, or "".
std::string key_suggestion(const std::string& key);
// " (did you mean [optimizer]?)" for the section nearest to `name`, or "".
std::string section_suggestion(const std::string& name);
bool is_section(const std::string& name);
// The value as a TOML literal that parses back to the same value (floats round-trip).
std::string toml_literal(const Value& v);
// Text quoted for a one-line message: control characters escaped.
std::string quoted(std::string_view s);
// Allowed values in words: "full_shard, no_shard", ">= 0", "0 .. 0.5", "> 0"; "" when any.
std::string allowed_text(const KeySpec& spec);

}  // namespace shardtrain::deck::detail
