// The dtype vocabulary: every tensor dtype the program names, with its short name (decks and
// command lines: fp32), torch's long name (errors and flight records: float32) and an alias
// some command lines accept (float). The deck's fsdp.*_dtype keys (fsdp::parse_dtype, allowed
// values choices::kDtypes), the collectives benchmark (--dtype) and the comm layer's messages
// all name dtypes through this one table.
#pragma once
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <vector>

namespace shardtrain::comm {

struct DtypeName {
  at::ScalarType type;
  const char* short_name;  // fp32
  const char* long_name;   // float32 (torch's)
  const char* alias;       // float; "" when none
};
const std::vector<DtypeName>& dtype_names();

// The dtype named by its short or long name, or (with_alias) its alias; nullopt otherwise.
std::optional<at::ScalarType> dtype_from_name(const std::string& name, bool with_alias);
// "fp32", ...; "?" for a dtype without a row.
const char* dtype_short_name(at::ScalarType t);
// "float32", ...; torch's own name for a dtype without a row.
std::string dtype_long_name(at::ScalarType t);
// The floating dtypes the collectives move (the table's floating rows, in its order), their
// short names (the benchmark's --dtype) and long names (the comm layer's errors).
std::vector<at::ScalarType> float_dtypes();
std::vector<std::string> float_dtype_short_names();
std::vector<std::string> float_dtype_long_names();

}  // namespace shardtrain::comm
