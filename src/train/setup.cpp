// Deck -> typed settings, with cross-key checks that need the world size.
#include "shardtrain/runtime/topology.h"
#include "shardtrain/train/setup.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "shardtrain/ckpt/peft.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/model/hf_config.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/util/choices.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/memory.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::train {

comm::CommOptions comm_options_from_deck(const deck::Deck& d) {
  comm::CommOptions o;
  o.timeout_s = d.get_float("comm.timeout_s");
  o.flight_recorder_entries = static_cast<int>(d.get_int("comm.flight_recorder"));
  return o;
}

BatchPlan plan_batches(const deck::Deck& d, int dp_ranks) {
  // The deck has checked what holds at any world size (micro_batch >= 1 by its range;
  // global_batch a multiple of micro_batch x grad_accum: Deck::check_relations); what is left
  // is the data-parallel ranks' share, stated here once.
  BatchPlan p;
  p.dp_ranks = dp_ranks;
  p.micro_batch = d.get_int("train.micro_batch");
  const int64_t gb = d.get_int("train.global_batch"), ga = d.get_int("train.grad_accum");
  if (gb == 0) {  // the global batch follows
    p.grad_accum = ga > 0 ? ga : 1;
    p.global_batch = p.micro_batch * p.grad_accum * dp_ranks;
    return p;
  }
  p.global_batch = gb;
  if (ga > 0) {  // all three given: the ranks must be the factor left
    p.grad_accum = ga;
    ST_USER_CHECK(gb == p.micro_batch * ga * dp_ranks, "train.global_batch = ", gb, " must equal train.micro_batch (",
                  p.micro_batch, ") x train.grad_accum (", ga, ") x data-parallel ranks (", dp_ranks, ")");
    return p;
  }
  // grad_accum follows: the ranks must divide the micro-batches of a step.
  ST_USER_CHECK(gb % (p.micro_batch * dp_ranks) == 0, "train.global_batch = ", gb,
                " is not a multiple of train.micro_batch (", p.micro_batch, ") x data-parallel ranks (", dp_ranks, ")");
  p.grad_accum = gb / (p.micro_batch * dp_ranks);
  const deck::KeySpec* ga_spec = deck::find_key("train.grad_accum");
  ST_USER_CHECK(p.grad_accum <= static_cast<int64_t>(ga_spec->max), "train.global_batch = ", p.global_batch,
                " / (train.micro_batch ", p.micro_batch, " x ", dp_ranks, " data-parallel ranks) = ", p.grad_accum,
                " micro-batches per step, more than the ", static_cast<int64_t>(ga_spec->max),
                " allowed: raise train.micro_batch or lower train.global_batch");
  return p;
}

void register_model_choices() {
  deck::set_choices("model.arch", model::arch_names());
  std::vector<std::string> presets = {""};
  for (const std::string& p : model::preset_names()) presets.push_back(p);
  deck::set_choices("model.preset", presets);
}

std::string hf_model_source(const deck::Deck& d) {
  const std::string& from_hf = d.get_string("model.from_hf");
  if (!from_hf.empty()) return from_hf;
  // init_from naming a Hugging Face directory brings its config along.
  const std::string& init_from = d.get_string("checkpoint.init_from");
  std::error_code ec;
  if (!init_from.empty() && std::filesystem::is_directory(init_from, ec) && model::has_hf_config(init_from))
    return init_from;
  return "";
}

void check_weights_hold(const model::ModelSpec& resolved, const std::string& weights, const std::string& who,
                        const std::function<std::string(const std::string& field)>& name) {
  const int64_t have = ckpt::safetensors_float_values(weights);
  const int64_t want = model::parameter_count(resolved);
  if (want <= have) return;
  std::string sizes;
  for (const auto& [field, v] : {std::pair{"n_layers", resolved.n_layers}, std::pair{"d_model", resolved.d_model},
                                 std::pair{"d_ff", resolved.d_ff}, std::pair{"vocab_size", resolved.vocab_size}})
    sizes += (sizes.empty() ? "" : ", ") + name(field) + " = " + std::to_string(v);
  throw UserError(who + " declares a model of " + std::to_string(want) + " parameters (" + sizes + "), but " + weights +
                  " holds " + std::to_string(have) + " values: these are not its weights");
}

namespace {
// The model of a config.json with the deck's seq_len and dropout; any other model key the deck
// sets must say what the config says.
model::ModelSpec spec_from_hf(const deck::Deck& d, const std::string& source) {
  const model::HfConfig c = model::read_hf_config(source);
  model::ModelSpec s = c.spec;
  const std::string via = d.is_set("model.from_hf") ? "model.from_hf" : "checkpoint.init_from";
  // A preset counts as the deck setting its fields: each must agree with the config too.
  const std::string preset = d.get_string("model.preset");
  const model::ModelSpec p = preset.empty() ? model::ModelSpec{} : model::preset_spec(preset);
  auto contradiction = [&](const std::string& key, const std::string& deck_value, const std::string& field,
                           const std::string& config_value) {
    const std::string where = d.is_set(key) ? d.origin(key) + ": " + key
                                            : d.origin("model.preset") + ": model.preset = \"" + preset + "\" gives " + key;
    throw UserError(where + " = " + deck_value + ", which contradicts " + c.source_of(field) + " = " + config_value +
                    " in " + c.path + " (" + via + "); remove the key or fix it");
  };
  if (d.is_set("model.arch") && d.get_string("model.arch") != s.arch)
    contradiction("model.arch", "\"" + d.get_string("model.arch") + "\"", "arch", "\"" + s.hf_architecture + "\" (arch llama)");
  if (!preset.empty() && p.arch != s.arch)
    contradiction("model.arch", "\"" + p.arch + "\"", "arch", "\"" + s.hf_architecture + "\" (arch llama)");
  for (const model::SpecField& f : model::spec_fields()) {
    const std::string key = std::string("model.") + f.name;
    const bool from_preset = !preset.empty() && !d.is_set(key);
    if ((!d.is_set(key) && !from_preset) || f.images_only) continue;
    const std::string name = f.name;
    // A preset's model fields only (its other fields are ModelSpec defaults, not choices).
    if (from_preset && (f.llama_only || name == "dropout")) continue;
    if (name == "seq_len") { s.seq_len = from_preset ? p.seq_len : d.get_int(key); continue; }
    if (name == "dropout") { s.dropout = d.get_float(key); continue; }
    if (f.int_field) {
      const int64_t v = from_preset ? p.*f.int_field : d.get_int(key);
      // n_kv_heads / d_ff 0 mean "derived": compare what they resolve to.
      const bool derived = v == 0 && (name == "n_kv_heads" || name == "d_ff" || name == "head_dim" || name == "max_positions");
      if (!derived && v != s.*f.int_field) contradiction(key, std::to_string(v), name, std::to_string(s.*f.int_field));
    }
    if (f.float_field) {
      const double v = from_preset ? p.*f.float_field : d.get_float(key);
      if (v != s.*f.float_field) contradiction(key, log::fmt(v), name, log::fmt(s.*f.float_field));
    }
    if (f.bool_field) {
      const bool v = from_preset ? p.*f.bool_field : d.get_bool(key);
      if (v != s.*f.bool_field) contradiction(key, v ? "true" : "false", name, s.*f.bool_field ? "true" : "false");
    }
    if (f.string_field && d.get_string(key) != s.*f.string_field)
      contradiction(key, "\"" + d.get_string(key) + "\"", name, "\"" + s.*f.string_field + "\"");
  }
  model::ModelSpec resolved;
  try {
    resolved = model::resolve_spec(s);
  } catch (const UserError& e) {
    throw UserError(c.path + " with the deck's model.seq_len = " + std::to_string(s.seq_len) + ": " + e.what());
  }
  // Weights beside the config (model.safetensors or its index) must hold the model it declares.
  std::string dir = std::filesystem::path(c.path).parent_path().string();
  if (dir.empty()) dir = ".";
  if (ckpt::has_safetensors_weights(dir))
    check_weights_hold(resolved, dir, c.path, [&](const std::string& field) { return c.source_of(field); });
  return resolved;
}
}  // namespace

namespace {
// What trains: [lora] and train.freeze (applied by model::build_model, model/lora.h). With
// lora.init_from the adapter's adapter_config.json fills the [lora] keys the deck does not set
// (as model.from_hf fills the model); one the deck sets must say the same.
model::Finetune finetune_from_deck(const deck::Deck& d) {
  model::Finetune f;
  f.lora.rank = d.get_int("lora.rank");
  f.lora.alpha = d.get_float("lora.alpha");
  f.lora.dropout = d.get_float("lora.dropout");
  f.lora.targets = d.get_string_list("lora.targets");
  f.lora.rslora = d.get_bool("lora.rslora");
  if (d.get_string("lora.base_dtype") == "nf4") {
    // QLoRA: a base in NF4 is a LoRA base (nothing else is frozen that way).
    ST_USER_CHECK(f.lora.rank > 0 || !d.get_string("lora.init_from").empty(), d.origin("lora.base_dtype"),
                  ": lora.base_dtype = \"nf4\" stores a LoRA base in 4 bits and needs LoRA: set lora.rank > 0 (QLoRA), or "
                  "remove the key (train.freeze keeps frozen parameters in fsdp.param_dtype)");
    const int64_t block = d.get_int("lora.nf4_block");
    ST_USER_CHECK(model::valid_nf4_block(block), d.origin("lora.nf4_block"), ": lora.nf4_block = ", block,
                  " is not a block size NF4 takes: a power of two from 32 to 4096 (bitsandbytes' sizes; 64 is "
                  "QLoRA's), so that every shard boundary of the padded flat falls on a block boundary");
    f.lora.nf4_block = block;
    f.lora.nf4_double_quant = d.get_bool("lora.nf4_double_quant");
  } else {
    for (const char* key : {"lora.nf4_block", "lora.nf4_double_quant"})
      ST_USER_CHECK(!d.is_set(key), d.origin(key), ": ", key, " is for lora.base_dtype = \"nf4\" (QLoRA), and this "
                    "deck keeps the base in fsdp.param_dtype: set lora.base_dtype = \"nf4\" or remove the key");
  }
  f.freeze = d.get_string_list("train.freeze");
  f.train_also = d.get_string_list("lora.train_also");
  const std::string dir = d.get_string("lora.init_from");
  if (dir.empty()) return f;
  const ckpt::PeftConfig c = ckpt::read_peft_config(dir);
  auto take = [&](const char* key, auto& field, const auto& value, const std::string& config_key) {
    if (!d.is_set(key)) {
      field = value;
      return;
    }
    if (field == value) return;
    std::ostringstream deck_value, config_value;
    deck_value << field;
    config_value << value;
    throw UserError(d.origin(key) + ": " + key + " = " + deck_value.str() + " contradicts " + config_key + " = " +
                    config_value.str() + " in " + dir + "/" + ckpt::kPeftConfigFile +
                    " (lora.init_from); remove the key or fix it");
  };
  take("lora.rank", f.lora.rank, c.r, "r");
  take("lora.alpha", f.lora.alpha, c.lora_alpha, "lora_alpha");
  take("lora.dropout", f.lora.dropout, c.lora_dropout, "lora_dropout");
  take("lora.rslora", f.lora.rslora, c.use_rslora, "use_rslora");
  // Targets and trained modules: the deck's if it sets them (the adapter's tensors must then fit
  // them), else the adapter's.
  if (!d.is_set("lora.targets")) f.lora.targets = c.target_modules;
  if (!d.is_set("lora.train_also")) {
    f.train_also.clear();
    for (const std::string& m : c.modules_to_save) f.train_also.push_back(ckpt::modules_to_save_pattern(m));
  }
  return f;
}

// The architecture and size: a Hugging Face config.json, a preset and the model.* keys.
model::ModelSpec architecture_from_deck(const deck::Deck& d) {
  const std::string hf = hf_model_source(d);
  if (!hf.empty()) return spec_from_hf(d, hf);
  model::ModelSpec s;
  const std::string preset = d.get_string("model.preset");
  if (!preset.empty()) s = model::preset_spec(preset);
  // A preset fixes every field the deck does not set explicitly.
  auto wanted = [&](const std::string& key) { return preset.empty() || d.is_set(key); };
  if (wanted("model.arch")) s.arch = d.get_string("model.arch");
  for (const model::SpecField& f : model::spec_fields()) {
    const std::string key = std::string("model.") + f.name;
    if (!wanted(key)) continue;
    if (f.int_field) s.*f.int_field = d.get_int(key);
    if (f.float_field) s.*f.float_field = d.get_float(key);
    if (f.bool_field) s.*f.bool_field = d.get_bool(key);
    if (f.string_field) s.*f.string_field = d.get_string(key);
  }
  return model::resolve_spec(s);
}
}  // namespace

model::ModelSpec model_spec_from_deck(const deck::Deck& d) {
  model::ModelSpec s = architecture_from_deck(d);
  s.finetune = finetune_from_deck(d);
  return s;
}

fsdp::Strategy strategy_from_deck(const deck::Deck& d) { return fsdp::parse_strategy(d.get_string("parallel.strategy")); }

fsdp::EngineOptions engine_options_from_deck(const deck::Deck& d, const model::Model& m, fsdp::Strategy deck_strategy) {
  fsdp::EngineOptions o;
  o.strategy = deck_strategy;
  o.mp.param_dtype = fsdp::parse_dtype(d.get_string("fsdp.param_dtype"));
  o.mp.reduce_dtype = fsdp::parse_dtype(d.get_string("fsdp.reduce_dtype"));
  o.mp.buffer_dtype = fsdp::parse_dtype(d.get_string("fsdp.buffer_dtype"));
  o.mp.keep_fp32 = d.get_string_list("fsdp.keep_fp32");
  o.reproducible = d.get_bool("train.reproducible");
  enum class Wrap { Block, Size, None };  // choices::kWrapPolicies' order; None: the whole model one unit
  const auto wrap = static_cast<Wrap>(choices::index_of(choices::kWrapPolicies, d.get_string("fsdp.wrap")));
  if (wrap == Wrap::Block) o.wrap_types = m.block_types();
  if (wrap == Wrap::Size) o.min_num_params = d.get_int("fsdp.min_num_params");
  o.ignored = d.get_string_list("fsdp.ignored_params");
  o.backward_prefetch = fsdp::parse_backward_prefetch(d.get_string("fsdp.backward_prefetch"));
  o.forward_prefetch = d.get_bool("fsdp.forward_prefetch");
  o.limit_all_gathers = static_cast<int>(d.get_int("fsdp.limit_all_gathers"));
  o.activation_checkpointing = d.get_bool("fsdp.activation_checkpointing");
  // On a CPU device nothing moves (the engine runs the offload flow, results unchanged); on
  // CUDA the shards and optimizer state live in pinned host memory (docs/gpu.md).
  o.cpu_offload = d.get_bool("fsdp.cpu_offload");
  // An adapter run's checkpoints hold what trains and identify the frozen base (train/base_model.h).
  o.checkpoint_frozen = !m.spec().finetune.lora.on();
  const model::LoraSpec& lora = m.spec().finetune.lora;
  if (lora.nf4()) {  // QLoRA: the blocks' frozen linear weights as NF4 codes
    o.nf4.block = lora.nf4_block;
    o.nf4.double_quant = lora.nf4_double_quant;
    o.nf4.params = model::nf4_base_params(const_cast<model::Model&>(m));
  }
  o.compression = compression_from_deck(d, o.strategy);  // checks replica_sync's rules too
  o.replica_sync = replica_sync_from_deck(d);
  return o;
}

void check_run_rules(const deck::Deck& d) {
  compression_from_deck(d, strategy_from_deck(d));  // checks replica_sync's (DiLoCo's) rules too
  optimizer_config_from_deck(d);
  lr_schedule_from_deck(d);
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

optim::LrSchedule lr_schedule_from_deck(const deck::Deck& d, std::string* note) {
  optim::LrSchedule s;
  s.decay = optim::parse_lr_decay(d.get_string("lr.schedule"));
  s.lr = static_cast<float>(d.get_float("optimizer.lr"));
  s.min_lr = static_cast<float>(d.get_float("lr.min_lr"));
  s.warmup_steps = d.get_int("lr.warmup_steps");
  const bool decay_key = d.get_int("lr.decay_steps") > 0;
  s.decay_steps = decay_key ? d.get_int("lr.decay_steps") : d.get_int("train.max_steps");
  // A run shorter than its warmup (a smoke run: --set train.max_steps=4 on a real deck) is
  // trainable: the warmup shrinks to a tenth of the horizon, with one note naming the keys.
  const int64_t horizon = s.decay == optim::LrDecay::Constant ? d.get_int("train.max_steps") : s.decay_steps;
  if (s.warmup_steps > 0 && horizon <= s.warmup_steps) {
    const int64_t scaled = horizon / 10;
    if (note)
      *note = log::fmt("# note: lr.warmup_steps = ", s.warmup_steps, " is not below ",
                       s.decay == optim::LrDecay::Constant || !decay_key ? "train.max_steps = " : "lr.decay_steps = ",
                       horizon, ": warming up over ", scaled, " step", scaled == 1 ? "" : "s",
                       " (a tenth of the run) instead; set lr.warmup_steps below ", horizon, " to choose\n");
    s.warmup_steps = scaled;
  }
  s.validate();
  return s;
}

namespace {

std::string gib(double b) {
  char s[64];
  std::snprintf(s, sizeof s, b >= 1024.0 * 1024 * 1024 * 1024 ? "%.3g TiB" : "%.3g GiB",
                b >= 1024.0 * 1024 * 1024 * 1024 ? b / (1024.0 * 1024 * 1024 * 1024) : b / (1024.0 * 1024 * 1024));
  return s;
}

}  // namespace

StepBytesBound step_bytes_lower_bound(const model::ModelSpec& spec, int64_t micro_batch, int world_size) {
  StepBytesBound b;
  const double B = static_cast<double>(micro_batch);
  b.params = static_cast<double>(model::parameter_count(spec));
  b.state = 8.0 * b.params / std::max(1, world_size);
  if (spec.finetune.any()) {
    // Frozen parameters: no gradient, at least 2 bytes (bf16) each; the trainable ones 8 (the
    // model on meta says which).
    std::shared_ptr<model::Model> meta = model::build_model(spec, at::kMeta);
    const double trains = static_cast<double>(model::trainable_parameter_count(*meta));
    const double frozen = static_cast<double>(model::total_parameter_count(*meta)) - trains;
    b.state = (8.0 * trains + 2.0 * frozen) / std::max(1, world_size);
  }
  double tokens = static_cast<double>(spec.seq_len);
  const bool images = model::input_kind(spec) == model::InputKind::Images;
  if (images) {  // a token per patch and the class token
    const double side = static_cast<double>(spec.image_size / spec.patch_size);
    tokens = side * side + 1;
  } else {
    b.logits = 4.0 * B * tokens * static_cast<double>(spec.vocab_size);
  }
  b.scores = 4.0 * B * static_cast<double>(spec.n_heads) * tokens * tokens;
  return b;
}

void check_fits_host_memory(const deck::Deck& d, const model::ModelSpec& spec, const BatchPlan& plan,
                            MPI_Comm world, bool device_is_cpu) {
  const int local_size = runtime::real_host_ranks(world).size;
  int world_size = 1;
  ST_MPI_CHECK(MPI_Comm_size(world, &world_size));
  const double host = read_host_memory().total_bytes;
  if (host <= 0 || !device_is_cpu) return;  // device memory is not known here
  const double per_rank = host / std::max(1, local_size);
  // Lower bounds only (doubles: nothing wraps), so a run that fits is never refused: the fp32
  // master weights and gradients sharded over every rank, plus the largest tensor one
  // micro-batch must hold at once (the logits, or one layer's attention scores).
  const StepBytesBound bound = step_bytes_lower_bound(spec, plan.micro_batch, world_size);
  const double params = bound.params, state = bound.state, logits = bound.logits, scores = bound.scores;
  const double act = std::max(logits, scores);
  if (state + act <= per_rank) return;
  std::string why;
  if (act >= state)
    why = (logits >= scores ? "its logits (train.micro_batch " + std::to_string(plan.micro_batch) + " x model.seq_len " +
                                  std::to_string(spec.seq_len) + " x model.vocab_size " +
                                  std::to_string(spec.vocab_size) + " x 4 bytes) alone take "
                            : "one layer's attention scores (train.micro_batch " + std::to_string(plan.micro_batch) +
                                  " x model.n_heads " + std::to_string(spec.n_heads) + " x " +
                                  (model::input_kind(spec) == model::InputKind::Images ? std::string("patches") : std::string("model.seq_len")) +
                                  "^2 x 4 bytes) alone take ") +
          gib(act);
  else
    why = "its " + std::to_string(static_cast<long long>(params)) +
          (spec.finetune.any() ? " parameters (frozen ones at 2 bytes, trained ones with fp32 weights and gradients)"
                               : " parameters' fp32 weights and gradients") +
          " alone take " + gib(state) + " per rank over " + std::to_string(world_size) + " ranks";
  // Blame the keys of the term that does not fit: an override of one of them first (that is
  // what changed), else the first the deck sets.
  std::vector<const char*> keys;
  if (act >= state && logits >= scores) keys = {"train.micro_batch", "model.seq_len", "model.vocab_size"};
  else if (act >= state) keys = {"model.seq_len", "train.micro_batch", "model.n_heads", "model.image_size"};
  else keys = {"model.d_model", "model.n_layers", "model.vocab_size", "model.d_ff", "model.preset"};
  std::string loc;
  for (const char* k : keys)
    if (d.is_set(k) && d.origin(k).rfind("--set", 0) == 0) {
      loc = d.origin(k);
      break;
    }
  for (const char* k : keys)
    if (loc.empty() && d.is_set(k)) loc = d.origin(k);
  if (loc.empty()) loc = d.source();
  throw UserError(loc + ": one training step of this deck cannot fit in memory: " + why + ", but this host has " +
                  gib(per_rank) + " per rank (" + gib(host) + " / " + std::to_string(local_size) +
                  " ranks); lower model.seq_len, train.micro_batch or the model size (`shardtrain plan DECK` shows "
                  "the memory per rank of each strategy)");
}

int max_threads_per_rank() {
  const unsigned hw = std::thread::hardware_concurrency();
  return 4 * static_cast<int>(std::max(1u, hw));
}

void check_thread_keys(const deck::Deck& d) {
  const int cap = max_threads_per_rank();
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  for (const char* key : {"run.threads", "optimizer.host_threads"}) {
    const int64_t t = d.get_int(key);
    ST_USER_CHECK(t <= cap, d.origin(key), ": ", key, " = ", t, " is more threads than this host can run: at most ",
                  cap, " (4 x its ", hw, " CPUs); 0 picks a good number");
  }
}

int threads_per_rank(const deck::Deck& d, int local_size) {
  int64_t t = d.get_int("run.threads");
  if (t > 0) return static_cast<int>(t);
  // A kernel may split its sums by thread: the count must not follow the ranks per host.
  if (d.get_bool("train.reproducible")) return 1;
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, local_size));
}

}  // namespace shardtrain::train
