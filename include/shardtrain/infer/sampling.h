// Text generation from a (sharded) language model: temperature, top-k and top-p sampling with
// a seeded generator of its own, greedy decoding at temperature 0. What `shardtrain generate`
// and the trainer's samples (train.sample_every) run.
#pragma once
#include <functional>
#include <c10/core/Device.h>
#include <mpi.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "shardtrain/model/model.h"

namespace shardtrain::infer {

struct SamplingOptions {
  double temperature = 0.8;    // 0 = greedy (the most likely token, the lowest id on ties)
  int64_t top_k = 0;           // keep the k most likely tokens; 0 = all
  double top_p = 1.0;          // keep the smallest set of most likely tokens whose probability reaches p
  int64_t max_new_tokens = 100;
  uint64_t seed = 0;
};

// UserError naming the option (`names` maps each field to its flag or key, in the order
// temperature, top_k, top_p, max_new_tokens) when a value is out of range.
void check_sampling_options(const SamplingOptions& o, const std::vector<std::string>& names);

// The next token from one position's logits (the first `vocab` entries; any padding beyond the
// tokenizer's vocabulary is never chosen). Computed in double on the host: the same logits and
// generator state give the same token on every machine.
int32_t choose_token(const std::vector<float>& logits, int64_t vocab, const SamplingOptions& o, std::mt19937_64& rng);

// Appends up to o.max_new_tokens tokens to `context` (the prompt's ids, not empty). The model
// sees at most its model.seq_len last tokens. Collective over `world` (the engine's forwards):
// every rank runs the same forwards and rank 0's choice is broadcast, so every rank returns
// the same tokens. Stops early after `stop_id` (>= 0) when it is generated.
std::vector<int32_t> generate_tokens(model::Model& net, std::vector<int32_t> context, int64_t vocab,
                                     const SamplingOptions& o, const c10::Device& device, MPI_Comm world,
                                     int32_t stop_id = -1,
                                     const std::function<void(int64_t generated)>& after_token = {});

}  // namespace shardtrain::infer
