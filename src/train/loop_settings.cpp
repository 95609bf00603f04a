// trainer_settings_from_deck: every key the step loop and its components use, read once.
#include "loop_settings.h"

#include <algorithm>

#include "shardtrain/runtime/agree.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::train {

TrainerSettings trainer_settings_from_deck(const deck::Deck& d, const comm::CommOptions& comm) {
  TrainerSettings s;
  s.max_steps = d.get_int("train.max_steps");
  s.max_tokens = d.get_int("train.max_tokens");
  s.seed = static_cast<uint64_t>(d.get_int("run.seed"));
  s.grad_clip = d.get_float("optimizer.grad_clip");
  s.on_nonfinite = nonfinite_policy_from_deck(d);
  s.out_dir = d.out_dir();
  s.device_key = d.get_string("run.device");
  s.val_every = d.get_int("train.val_every");
  s.val_batches = d.get_int("train.val_batches");
  s.sample_every = d.get_int("train.sample_every");
  s.sample_tokens = d.get_int("train.sample_tokens");
  s.sample_top_k = d.get_int("train.sample_top_k");
  s.sample_temperature = d.get_float("train.sample_temperature");
  s.sample_prompt = d.get_string("train.sample_prompt");
  s.tokenizer = d.get_string("data.tokenizer");
  s.log_every = d.get_int("log.every");
  s.metrics_file = d.get_string("log.metrics_file");
  s.peak_tflops = d.get_float("log.peak_tflops");
  s.ckpt_dir = d.checkpoint_dir();
  s.resume = d.get_string("checkpoint.resume");
  s.previous_run = d.get_string("checkpoint.previous_run");
  s.init_from = d.get_string("checkpoint.init_from");
  s.lora_init_from = d.get_string("lora.init_from");
  s.allow_data_change = d.get_bool("checkpoint.allow_data_change");
  s.dataset = d.get_string("data.dataset");
  s.every_steps = d.get_int("checkpoint.every_steps");
  s.every_minutes = d.get_float("checkpoint.every_minutes");
  s.keep_last = static_cast<int>(d.get_int("checkpoint.keep_last"));
  s.async = d.get_bool("checkpoint.async");
  // Never below 600 s: a short comm.timeout_s (quick hang detection) must not cut off the
  // flush of a large checkpoint on a slow filesystem.
  s.write_deadline_s = std::max(600.0, comm.timeout_s);
  return s;
}

RunSettings run_settings_from_deck(const deck::Deck& d, MPI_Comm world) {
  RunSettings r;
  runtime::run_agreed(world, [&] {
    check_run_rules(d);  // what `deck check` applies too, before anything else of the run
    r.comm = comm_options_from_deck(d);
    r.schedule = lr_schedule_from_deck(d, &r.schedule_note);
    r.optimizer = optimizer_config_from_deck(d);
    r.loop = trainer_settings_from_deck(d, r.comm);
    r.data_keys = data_keys_from_deck(d);
  });
  return r;
}

void plan_run_batches(RunSettings& rs, const deck::Deck& d, const ShardedJob& job, MPI_Comm world) {
  int rank = 0, size = 1;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  ST_MPI_CHECK(MPI_Comm_size(world, &size));
  runtime::run_agreed(world, [&] {
    rs.leaves = plan_leaves(d, size, rank, job.comms.shard ? job.comms.shard->size() : 1,
                            job.comms.world && job.comms.world->backend() == comm::Backend::Nccl);
    rs.batch = plan_batches(d, size);
    check_fits_host_memory(d, job.spec, rs.batch, world, job.device.is_cpu());
  });
}

}  // namespace shardtrain::train
