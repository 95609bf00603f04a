// The largest model and tokenizer sizes shardtrain accepts: one table, stated once. The deck's
// model.* ranges (deck schema), every resolved model (model::resolve_spec), a Hugging Face
// config.json (model::read_hf_config, naming its keys), a checkpoint's recorded model and the
// tokenizer files are checked against it; docs/security.md ("Files from the hub") prints it.
// Why bounds at all: a file from someone else says how much to allocate; within these no size
// overflows (every weight matrix stays below 2^48 elements, a parameter count below 2^57), and
// what is left to check is whether the memory is there.
#pragma once
#include <cstdint>
#include <string_view>

#include "shardtrain/util/error.h"

namespace shardtrain::limits {

// The largest value of one ModelSpec size field (the deck key model.<field>).
struct SizeLimit {
  std::string_view field;
  int64_t max;
};
inline constexpr SizeLimit kModelSizes[] = {
    {"vocab_size", 2147483647},  // token ids are int32
    {"seq_len", int64_t{1} << 20},
    {"d_model", int64_t{1} << 17},
    {"n_layers", int64_t{1} << 14},
    {"n_heads", int64_t{1} << 17},
    {"n_kv_heads", int64_t{1} << 17},
    {"d_ff", int64_t{1} << 20},
    {"head_dim", int64_t{1} << 16},
    {"max_positions", int64_t{1} << 30},
    {"sliding_window", int64_t{1} << 30},
    {"rope_original_max_positions", int64_t{1} << 30},
    {"image_size", 65536},
    {"patch_size", 65536},
    {"channels", 65536},
    {"num_classes", int64_t{1} << 20},
};

// A width made of two fields is held to the widest single width (d_ff's): the attention width
// n_heads x head_dim (llama) and n_kv_heads x head_dim, and a ViT's patch vector channels x
// patch_size^2 and its patches per image. With the table above this keeps every weight matrix
// below 2^48 elements and every parameter count and tensor size far from int64's end.
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;

// Tokenizer files: token ids index dense tables (decoding), so they stay below 2^26; the added
// tokens' text all together bounds the automaton that finds them in a text (data/added_tokens.h).
inline constexpr int64_t kMaxTokenizerIds = int64_t{1} << 26;
inline constexpr int64_t kMaxAddedTokenBytes = int64_t{4} << 20;

// The limit of a field of kModelSizes (a name not in the table is a programming error).
constexpr int64_t max_of(std::string_view field) {
  for (const SizeLimit& l : kModelSizes)
    if (l.field == field) return l.max;
  throw Error("limits::max_of: no limit for '" + std::string(field) + "'");
}

}  // namespace shardtrain::limits
