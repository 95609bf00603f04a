// Deck -> typed settings for a training run: model spec, batch plan, engine and optimizer options.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>

#include "shardtrain/comm/comm.h"
#include "shardtrain/data/packing.h"
#include "shardtrain/deck/deck.h"
#include "shardtrain/fsdp/options.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/model/model.h"
#include "shardtrain/optim/lr_schedule.h"

namespace shardtrain::train {

// Global batch = micro_batch x grad_accum x data-parallel ranks. Decks give any two of
// them (or only micro_batch: grad_accum 1); the third is derived and all are checked.
struct BatchPlan {
  int64_t micro_batch = 1, grad_accum = 1, global_batch = 1;
  int dp_ranks = 1;
};
BatchPlan plan_batches(const deck::Deck& d, int dp_ranks);

// model.* keys over the preset (when model.preset is set, keys the deck sets override it); or,
// with a Hugging Face source (hf_model_source), its config.json with the deck's seq_len and
// dropout: any other model key the deck sets and the config contradicts is a UserError naming
// both (the deck key's origin, the config key and file).
model::ModelSpec model_spec_from_deck(const deck::Deck& d);
// The directory (or config.json) the model comes from: model.from_hf, else checkpoint.init_from
// when it is a directory holding a config.json; "" = the model keys.
std::string hf_model_source(const deck::Deck& d);
// A model's parameters against the values a safetensors source holds (headers only): a model
// that needs more than `weights` hold cannot be these weights, and is refused before it is built
// or anything allocated. UserError "<who> declares a model of N parameters (<sizes>), but
// <weights> hold M values: ...". `name` says what each size is called where it came from
// (config.json keys, deck keys).
void check_weights_hold(const model::ModelSpec& resolved, const std::string& weights, const std::string& who,
                        const std::function<std::string(const std::string& field)>& name);
// Hands the deck schema the model layer's names: model.arch's allowed values are
// model::arch_names(), model.preset's "" and model::preset_names(). The program calls it once
// at start-up, so a new architecture is named only in src/model.
void register_model_choices();
// comm.timeout_s and comm.flight_recorder for every communicator of a job.
comm::CommOptions comm_options_from_deck(const deck::Deck& d);
// parallel.strategy, parsed once per command and handed down.
fsdp::Strategy strategy_from_deck(const deck::Deck& d);
// fsdp.* and train.reproducible for the deck's strategy (its fsdp.quantize_* checked against it).
fsdp::EngineOptions engine_options_from_deck(const deck::Deck& d, const model::Model& m, fsdp::Strategy deck_strategy);
// The fsdp.quantize_* / quant_* keys; a combination the engine does not run (quantize_grads
// without a hybrid strategy, quantize_weights with no_shard, either with cpu_offload or
// train.reproducible) is a UserError naming the key (compression_keys.cpp).
fsdp::Compression compression_from_deck(const deck::Deck& d, fsdp::Strategy strategy);
// parallel.replica_sync and the [diloco] keys, read once (compression_keys.cpp); the strategy x
// option rules for them are checked with the compression keys (compression_from_deck).
fsdp::ReplicaSync replica_sync_from_deck(const deck::Deck& d);
fsdp::OptimizerConfig optimizer_config_from_deck(const deck::Deck& d);
// A warmup as long as the run (or the decay) is scaled to a tenth of it; `note` (when given)
// receives the one line saying so, naming both keys.
optim::LrSchedule lr_schedule_from_deck(const deck::Deck& d, std::string* note = nullptr);
// The rules of a training run that depend on the deck alone (no world size, no file): the
// strategy with the compression and DiLoCo keys (compression_from_deck), the optimizer and the lr
// schedule. `train` applies them (run_settings_from_deck) and `deck check` applies this same
// function, so a deck that checks is one `train` accepts on these rules. UserError naming the key.
void check_run_rules(const deck::Deck& d);
// The rules between the deck and its data.dataset, which `deck check` and `train` both apply
// with this function before anything runs: the packing keys against the dataset's row
// boundaries, and data.overlong = "error" against both splits' rows at model.seq_len (a scan of
// the rows). Nothing for synthetic data, images or a dataset that is not there (train names that).
void check_data_rules(const deck::Deck& d, const model::ModelSpec& spec);
// data.packing, data.document_mask and data.overlong for the token dataset `dataset_dir` ("auto"
// resolved by its meta.json: packed for instruction data with rows, else stream); the default
// (stream) when the directory holds no token dataset (the reader names that).
data::PackingOptions packing_from_deck(const deck::Deck& d, const std::string& dataset_dir);

// Lower bounds (bytes per rank, doubles: nothing wraps) of one training step: the fp32 weights
// and gradients sharded over world_size ranks, and the largest tensor of one micro-batch (the
// logits of a language model, one layer's attention scores).
struct StepBytesBound {
  double params = 0, state = 0, logits = 0, scores = 0;
  double total() const { return state + (logits > scores ? logits : scores); }
};
StepBytesBound step_bytes_lower_bound(const model::ModelSpec& spec, int64_t micro_batch, int world_size);

// Collective over world. A lower bound of one step's memory per rank (fp32 weights and
// gradients sharded over all ranks; a frozen parameter 2 bytes and no gradient, plus, on a CPU device, the logits or one layer's attention
// scores of a micro-batch) against this host's memory shared by its ranks: UserError naming
// the keys (model.seq_len, train.micro_batch) and `shardtrain plan` when it cannot fit, instead
// of an allocation failure deep in libtorch. Never refuses a run that would fit.
void check_fits_host_memory(const deck::Deck& d, const model::ModelSpec& spec, const BatchPlan& plan,
                            MPI_Comm world, bool device_is_cpu);

// Intra-op threads per rank: run.threads, or cores / ranks on this host (at least 1).
int threads_per_rank(const deck::Deck& d, int local_size);
// The most threads a rank may ask for on this host: 4 x std::thread::hardware_concurrency().
int max_threads_per_rank();
// run.threads and optimizer.host_threads against max_threads_per_rank(): UserError naming the
// key, its origin and the cap (100000 threads would exhaust the process limit and abort).
void check_thread_keys(const deck::Deck& d);

}  // namespace shardtrain::train
