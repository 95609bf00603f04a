// The trainer's settings, read from the deck once before the loop (the loop reads no keys).
#pragma once
#include <cstdint>
#include <string>

#include <mpi.h>

#include "data_source.h"
#include "divergence.h"
#include "shardtrain/deck/deck.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/optim/lr_schedule.h"
#include "shardtrain/train/job.h"
#include "shardtrain/train/leaf_plan.h"
#include "shardtrain/train/setup.h"

namespace shardtrain::train {

struct TrainerSettings {
  // [train] / [run]
  int64_t max_steps = 0, max_tokens = 0;  // max_tokens 0 = no limit
  uint64_t seed = 0;
  double grad_clip = 0;
  NonFinitePolicy on_nonfinite;
  std::string out_dir, device_key;
  // [train] validation
  int64_t val_every = 0, val_batches = 0;
  // [train] samples (TextSampler)
  int64_t sample_every = 0, sample_tokens = 64, sample_top_k = 40;
  double sample_temperature = 0.8;
  std::string sample_prompt, tokenizer;  // tokenizer: data.tokenizer
  // [log]
  int64_t log_every = 1;
  std::string metrics_file;  // relative to out_dir; "" = none
  double peak_tflops = 0;    // 0 = measure
  // [checkpoint]
  std::string ckpt_dir, resume, previous_run, init_from;
  std::string lora_init_from;      // lora.init_from: a PEFT adapter directory for a fresh start
  bool allow_data_change = false;  // checkpoint.allow_data_change
  std::string dataset;             // data.dataset ("" = synthetic items)
  int64_t every_steps = 0;
  double every_minutes = 0;
  int keep_last = 1;
  bool async = false;
  double write_deadline_s = 600;  // max(600 s, comm.timeout_s): a stuck checkpoint write ends the job (exit 5)
};

// `comm`: the run's comm options (comm_options_from_deck), whose timeout bounds write_deadline_s.
TrainerSettings trainer_settings_from_deck(const deck::Deck& d, const comm::CommOptions& comm);

// Everything `train` reads from the deck besides what open_sharded_job read: built once, before
// anything is written, and handed down (no component reads a key after it). The keys first,
// before the job opens (comm.timeout_s watches the job's set-up); the batch and leaf plans,
// which need the job's world and groups, once it is open (plan_run_batches).
struct RunSettings {
  TrainerSettings loop;
  comm::CommOptions comm;           // comm.timeout_s: also the world's blocking regions' limit
  BatchPlan batch;                  // with leaves.on: leaves.per_rank micro-batches per rank
  LeafPlan leaves;                  // train.reproducible
  optim::LrSchedule schedule;
  std::string schedule_note;        // a warmup scaled to the run (lr_schedule_from_deck), printed once
  fsdp::OptimizerConfig optimizer;
  DataKeys data_keys;               // what a token dataset is checked against
};
// Collective over world (one agreement): every key but the batch plans'.
RunSettings run_settings_from_deck(const deck::Deck& d, MPI_Comm world);
// Collective over world (one agreement): rs.batch and rs.leaves for the open job, and
// check_fits_host_memory (a huge seq_len or micro_batch is exit 2 here, not a bad_alloc later).
void plan_run_batches(RunSettings& rs, const deck::Deck& d, const ShardedJob& job, MPI_Comm world);

}  // namespace shardtrain::train
