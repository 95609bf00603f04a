// A reader for R's serialization format (XDR, versions 2 and 3) covering what data packages
// store: character/integer/logical/real/raw vectors, lists, pairlists, attributes, symbols,
// references and the ALTREP compact sequences. Closures, environments and bytecode are refused.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardtrain::data {

struct RValue {
  enum class Type { Null, Symbol, Pairlist, Logical, Integer, Real, String, List, Raw };
  Type type = Type::Null;
  std::string symbol;                          // Symbol: its name
  std::vector<std::int32_t> ints;              // Logical, Integer (NA = INT32_MIN)
  std::vector<double> reals;                   // Real
  std::vector<std::optional<std::string>> strings;  // String (UTF-8; nullopt = NA)
  std::vector<std::string> bytes;              // Raw: one element holding the bytes
  std::vector<RValue> elements;                // List, Pairlist (values)
  std::vector<std::string> tags;               // Pairlist: tag of each element ("" = none)
  std::vector<std::pair<std::string, RValue>> attributes;

  // The attribute named `name`, or nullptr.
  const RValue* attribute(const std::string& name) const;
  // List element by its "names" attribute, or nullptr.
  const RValue* element(const std::string& name) const;
  std::size_t length() const;
  const char* type_name() const;
};

// Parses one serialized object. `where` names the source (file and offset) in UserErrors,
// which also give the byte offset inside the stream.
RValue parse_r_serialized(std::string_view data, const std::string& where);

}  // namespace shardtrain::data
