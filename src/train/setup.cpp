// Deck -> typed settings, with cross-key checks that need the world size.
#include "shardtrain/train/setup.h"

#include <thread>

#include "shardtrain/util/error.h"

namespace shardtrain::train {

comm::CommOptions comm_options_from_deck(const deck::Deck& d) {
  comm::CommOptions o;
  o.timeout_s = d.get_float("comm.timeout_s");
  o.flight_recorder_entries = static_cast<int>(d.get_int("comm.flight_recorder"));
  return o;
}

BatchPlan plan_batches(const deck::Deck& d, int dp_ranks) {
  BatchPlan p;
  p.dp_ranks = dp_ranks;
  const int64_t mb = d.get_int("train.micro_batch"), gb = d.get_int("train.global_batch"),
                ga = d.get_int("train.grad_accum");
  ST_USER_CHECK(mb > 0, "train.micro_batch must be > 0");
  p.micro_batch = mb;
  if (gb > 0 && ga > 0) {
    p.global_batch = gb;
    p.grad_accum = ga;
  } else if (gb > 0) {
    ST_USER_CHECK(gb % (mb * dp_ranks) == 0, "train.global_batch = ", gb, " is not a multiple of train.micro_batch (",
                  mb, ") x data-parallel ranks (", dp_ranks, ")");
    p.global_batch = gb;
    p.grad_accum = gb / (mb * dp_ranks);
  } else {
    p.grad_accum = ga > 0 ? ga : 1;
    p.global_batch = mb * p.grad_accum * dp_ranks;
  }
  ST_USER_CHECK(p.global_batch == p.micro_batch * p.grad_accum * dp_ranks, "train.global_batch = ",
                p.global_batch, " must equal train.micro_batch (", p.micro_batch, ") x train.grad_accum (",
                p.grad_accum, ") x data-parallel ranks (", dp_ranks, ")");
  return p;
}

model::ModelSpec model_spec_from_deck(const deck::Deck& d) {
  model::ModelSpec s;
  const std::string preset = d.get_string("model.preset");
  if (!preset.empty()) s = model::preset_spec(preset);
  auto take_int = [&](const char* key, int64_t& field) {
    if (preset.empty() || d.is_set(key)) field = d.get_int(key);
  };
  auto take_float = [&](const char* key, double& field) {
    if (preset.empty() || d.is_set(key)) field = d.get_float(key);
  };
  if (preset.empty() || d.is_set("model.arch")) s.arch = d.get_string("model.arch");
  take_int("model.vocab_size", s.vocab_size);
  take_int("model.seq_len", s.seq_len);
  take_int("model.d_model", s.d_model);
  take_int("model.n_layers", s.n_layers);
  take_int("model.n_heads", s.n_heads);
  take_int("model.n_kv_heads", s.n_kv_heads);
  take_int("model.d_ff", s.d_ff);
  take_float("model.norm_eps", s.norm_eps);
  take_float("model.rope_theta", s.rope_theta);
  if (preset.empty() || d.is_set("model.tie_embeddings")) s.tie_embeddings = d.get_bool("model.tie_embeddings");
  take_int("model.image_size", s.image_size);
  take_int("model.patch_size", s.patch_size);
  take_int("model.channels", s.channels);
  take_int("model.num_classes", s.num_classes);
  take_float("model.dropout", s.dropout);
  return model::resolve_spec(s);
}

fsdp::EngineOptions engine_options_from_deck(const deck::Deck& d, const model::Model& m) {
  fsdp::EngineOptions o;
  o.strategy = fsdp::parse_strategy(d.get_string("parallel.strategy"));
  o.mp.param_dtype = fsdp::parse_dtype(d.get_string("fsdp.param_dtype"));
  o.mp.reduce_dtype = fsdp::parse_dtype(d.get_string("fsdp.reduce_dtype"));
  o.mp.buffer_dtype = fsdp::parse_dtype(d.get_string("fsdp.buffer_dtype"));
  o.mp.keep_fp32 = d.get_string_list("fsdp.keep_fp32");
  const std::string wrap = d.get_string("fsdp.wrap");
  if (wrap == "block") o.wrap_types = m.block_types();
  if (wrap == "size") o.min_num_params = d.get_int("fsdp.min_num_params");
  o.ignored = d.get_string_list("fsdp.ignored_params");
  o.backward_prefetch = fsdp::parse_backward_prefetch(d.get_string("fsdp.backward_prefetch"));
  o.forward_prefetch = d.get_bool("fsdp.forward_prefetch");
  o.limit_all_gathers = static_cast<int>(d.get_int("fsdp.limit_all_gathers"));
  o.activation_checkpointing = d.get_bool("fsdp.activation_checkpointing");
  // On a CPU device nothing moves (the engine runs the offload flow, results unchanged); on
  // CUDA the shards and optimizer state live in pinned host memory (docs/gpu.md).
  o.cpu_offload = d.get_bool("fsdp.cpu_offload");
  return o;
}

fsdp::OptimizerConfig optimizer_config_from_deck(const deck::Deck& d) {
  fsdp::OptimizerConfig c;
  c.name = d.get_string("optimizer.name");
  c.adamw.beta1 = static_cast<float>(d.get_float("optimizer.beta1"));
  c.adamw.beta2 = static_cast<float>(d.get_float("optimizer.beta2"));
  c.adamw.eps = static_cast<float>(d.get_float("optimizer.eps"));
  c.adamw.weight_decay = static_cast<float>(d.get_float("optimizer.weight_decay"));
  c.sgd.momentum = static_cast<float>(d.get_float("optimizer.momentum"));
  c.sgd.weight_decay = static_cast<float>(d.get_float("optimizer.weight_decay"));
  c.no_decay = d.get_string_list("optimizer.no_decay");
  c.host_threads = static_cast<int>(d.get_int("optimizer.host_threads"));  // 0: the job fills in its threads
  if (c.name == "adamw") c.adamw.validate();
  else c.sgd.validate();
  return c;
}

optim::LrSchedule lr_schedule_from_deck(const deck::Deck& d) {
  optim::LrSchedule s;
  s.decay = optim::parse_lr_decay(d.get_string("lr.schedule"));
  s.lr = static_cast<float>(d.get_float("optimizer.lr"));
  s.min_lr = static_cast<float>(d.get_float("lr.min_lr"));
  s.warmup_steps = d.get_int("lr.warmup_steps");
  s.decay_steps = d.get_int("lr.decay_steps") > 0 ? d.get_int("lr.decay_steps") : d.get_int("train.max_steps");
  ST_USER_CHECK(s.decay == optim::LrDecay::Constant || s.decay_steps > s.warmup_steps, "lr.warmup_steps = ",
                s.warmup_steps, " must be below ",
                d.get_int("lr.decay_steps") > 0 ? "lr.decay_steps = " : "train.max_steps (lr.decay_steps = 0) = ",
                s.decay_steps, " with lr.schedule = ", d.get_string("lr.schedule"),
                ": shorten the warmup or use lr.schedule = \"constant\"");
  s.validate();
  return s;
}

int threads_per_rank(const deck::Deck& d, int local_size) {
  int64_t t = d.get_int("run.threads");
  if (t > 0) return static_cast<int>(t);
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, local_size));
}

}  // namespace shardtrain::train
