// Deck values: defaults from the schema, typed getters, provenance and the deck hash.
#include "deck_detail.h"
#include "shardtrain/util/error.h"

namespace shardtrain::deck {
namespace {

const KeySpec& spec_of(const std::string& key, Type expected) {
  const KeySpec* spec = find_key(key);
  ST_CHECK(spec, "no deck key '", key, "' in the schema");
  ST_CHECK(spec->type == expected, "deck key '", key, "' is ", to_string(spec->type), ", read as ",
           to_string(expected));
  return *spec;
}

}  // namespace

Deck Deck::from_schema() {
  Deck d;
  for (const auto& spec : schema()) d.values_[spec.key] = spec.default_value;
  d.source_ = "defaults";
  return d;
}

Deck Deck::defaults(const std::vector<std::string>& overrides) {
  Deck d = from_schema();
  for (const auto& o : overrides) d.apply_override(o);
  d.check_relations();
  return d;
}

void Deck::set_value(const std::string& key, Value v, std::string origin) {
  values_[key] = std::move(v);
  set_[key] = true;
  origin_[key] = std::move(origin);
}

int64_t Deck::get_int(const std::string& key) const {
  spec_of(key, Type::Int);
  return std::get<int64_t>(values_.at(key));
}
double Deck::get_float(const std::string& key) const {
  spec_of(key, Type::Float);
  return std::get<double>(values_.at(key));
}
bool Deck::get_bool(const std::string& key) const {
  spec_of(key, Type::Bool);
  return std::get<bool>(values_.at(key));
}
const std::string& Deck::get_string(const std::string& key) const {
  spec_of(key, Type::String);
  return std::get<std::string>(values_.at(key));
}
const std::vector<std::string>& Deck::get_string_list(const std::string& key) const {
  spec_of(key, Type::StringList);
  return std::get<std::vector<std::string>>(values_.at(key));
}

bool Deck::is_set(const std::string& key) const {
  ST_CHECK(find_key(key), "no deck key '", key, "' in the schema");
  auto it = set_.find(key);
  return it != set_.end() && it->second;
}

std::string Deck::origin(const std::string& key) const {
  auto it = origin_.find(key);
  return it == origin_.end() ? "default" : it->second;
}

std::string Deck::out_dir() const {
  const std::string& dir = get_string("run.out_dir");
  return dir.empty() ? "runs/" + get_string("run.name") : dir;
}

std::string Deck::checkpoint_dir() const {
  const std::string& dir = get_string("checkpoint.dir");
  return dir.empty() ? out_dir() + "/checkpoints" : dir;
}

uint64_t Deck::hash() const {
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64 offset basis
  for (unsigned char c : resolved_toml()) {
    h ^= c;
    h *= 1099511628211ull;  // FNV-1a 64 prime
  }
  return h;
}

}  // namespace shardtrain::deck
