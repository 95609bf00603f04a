// run_training: topology -> mesh -> comms -> sharded model -> data -> resume -> the step loop.
// The loop states the algorithm; its components (train_step, StepLogger, DivergenceGuard,
// Validator, TextSampler, Checkpointer) each decide for themselves whether to act at a step.
#include "shardtrain/train/trainer.h"

#include <c10/core/DeviceGuard.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <vector>

#include "checkpointer.h"
#include "shardtrain/data/identity.h"
#include "data_source.h"
#include "divergence.h"
#include "loop_settings.h"
#include "shardtrain/train/resume_state.h"
#include "save_schedule.h"
#include "step_agreement.h"
#include "shardtrain/ckpt/manager.h"
#include "shardtrain/ckpt/preflight.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/comm/watch_regions.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/model/bf16_gemm.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/runtime/blocking_region.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/train/adapter_base.h"
#include "shardtrain/train/alloc_tracker.h"
#include "shardtrain/train/job.h"
#include "shardtrain/train/leaf_plan.h"
#include "shardtrain/train/metrics.h"
#include "shardtrain/train/peak_flops.h"
#include "shardtrain/ckpt/run_dirs.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/train/signals.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/timer.h"
#include "spec_json.h"
#include "start_report.h"
#include "step_logger.h"
#include "step_result.h"
#include "text_sampler.h"
#include "train_step.h"
#include "validator.h"

namespace shardtrain::train {
namespace {

struct StartPoint {
  LoopPosition pos;
  int64_t resumed_step = -1;  // -1: a fresh start
  std::string from;           // the checkpoint resumed from
  std::string data_change;    // what differs from the checkpoint's data (allowed by the deck)
};

// What resume_or_start decides from and loads into.
struct StartContext {
  const TrainerSettings& settings;
  const ckpt::RunDirs& run_dirs;
  ckpt::CheckpointManager& ckpts;
  fsdp::Engine& engine;
  fsdp::ShardedOptimizer& optimizer;
  const DataSource& data;
  int64_t global_batch = 0;
  c10::Device device = c10::kCPU;
  int rank = 0, size = 1;
  MPI_Comm world = MPI_COMM_NULL;
  std::string guarantee;  // train.reproducible's dependencies (leaf_plan.h), "" when off
  std::string data_id;    // data_identity of data.dataset
  const ckpt::BaseIdentity* base = nullptr;  // an adapter run's base, loaded already (adapter_base.h)
};

// Resume (the newest usable checkpoint of this run, or the one named), else a fresh start
// from run.seed or checkpoint.init_from. Collective.
StartPoint resume_or_start(const StartContext& c) {
  const TrainerSettings& s = c.settings;
  const ckpt::RunDirs& run_dirs = c.run_dirs;
  ckpt::CheckpointManager& ckpts = c.ckpts;
  const c10::Device& device = c.device;
  const int rank = c.rank;
  MPI_Comm world = c.world;
  StartPoint sp;
  std::string notes, data_change;
  std::optional<fsdp::GuardState> guard;  // the candidate's accuracy-guard state, if it has one
  // A candidate whose loop state cannot be restored (data cursor, generator states) is
  // skipped before any weight is loaded, like one that does not verify.
  auto restorable = [&](const std::string& path) {
    runtime::run_agreed(world, [&] {
      notes.clear();
      data_change.clear();
      try {
        const ckpt::TrainState st = ckpt::read_train_state(path);
        sp.pos = apply_train_state(st, path, c.global_batch, s.seed, rank, c.size, notes, device, c.guarantee);
        guard = guard_state_of(st, path);
        c.data.check_cursor(sp.pos.cursor);
        // Checked after the choice, not here: a checkpoint of other data is not a bad file
        // to set aside, and the resume must stop rather than fall back to an older one.
        const nlohmann::json extra = nlohmann::json::parse(st.extra_json, nullptr, false);
        if (extra.is_object() && extra.contains("data"))
          data_change = data::data_identity_differences(extra["data"].dump(), c.data_id);
      } catch (const UserError&) {
        throw;
      } catch (const std::exception& e) {
        throw UserError(path + ": the training state (/train) cannot be restored: " + e.what());
      }
    });
  };
  const std::optional<std::string> from = ckpts.find_resume(run_dirs.resume, restorable);
  if (from && !data_change.empty()) {
    runtime::run_agreed(world, [&] {
      ST_USER_CHECK(s.allow_data_change, *from, " was trained on other data than data.dataset = '", s.dataset, "': ",
                    data_change, ". Resuming would continue on different data; to do it anyway: --set "
                    "checkpoint.allow_data_change=true (a warning in the log and metrics), or start a new run: "
                    "--set run.name=<another name>");
    });
    sp.data_change = data_change;
    if (rank == 0) log::warn("resuming " + *from + " on other data (checkpoint.allow_data_change = true): " + data_change);
  }
  if (from) {
    // An adapter checkpoint continues only on the base it was trained on (and only as one).
    runtime::run_agreed(world, [&] {
      const std::string recorded = ckpt::read_checkpoint_meta(*from).base_json;
      if (c.base) check_adapter_base(*from, recorded, *c.base, "resume");
      else ST_USER_CHECK(recorded.empty(), *from, " holds a LoRA adapter, not a whole model: resume it with its deck's "
                         "[lora] section (lora.rank > 0) and base (checkpoint.init_from)");
    });
    Timer load_timer;
    ckpt::TrainState st;
    const ckpt::IoStats io = ckpt::load_checkpoint(*from, c.engine, c.optimizer, st, world);
    if (guard) {
      const std::string skipped = c.engine.restore_guard_state(*guard);
      if (!skipped.empty()) notes += "# note: accuracy guard: " + skipped + "\n";
    }
    ckpt::CheckpointMeta meta;
    runtime::run_agreed(world, [&] {
      if (rank == 0) meta = ckpt::read_checkpoint_meta(*from);
    });
    sp.resumed_step = sp.pos.step;
    sp.from = *from;
    if (rank == 0) {
      std::printf("# resumed from %s: step %lld, %lld tokens seen, data epoch %lld position %lld; written by %lld "
                  "ranks (%s, %lld replicate x %lld shard) at %s; loaded %.1f MB in %.2f s\n%s",
                  from->c_str(), static_cast<long long>(sp.pos.step), static_cast<long long>(sp.pos.tokens_seen),
                  static_cast<long long>(sp.pos.cursor.epoch), static_cast<long long>(sp.pos.cursor.position),
                  static_cast<long long>(meta.world_size), meta.strategy.c_str(),
                  static_cast<long long>(meta.replicate_size), static_cast<long long>(meta.shard_group_size),
                  meta.created.c_str(), io.bytes / 1e6, load_timer.seconds(), notes.c_str());
      std::fflush(stdout);
    }
    return sp;
  }
  sp.pos = LoopPosition{};  // a rejected candidate may have filled it
  seed_default_generator(s.seed, rank, device);
  if (rank == 0) {
    std::printf("# starting fresh (checkpoint.resume = \"%s\"); run %s%s; checkpoints in %s\n", s.resume.c_str(),
                run_dirs.run_id.c_str(), run_dirs.new_run ? " (new)" : " (no usable checkpoint of it yet)",
                ckpts.dir().c_str());
    std::fflush(stdout);
  }
  if (c.base) {  // an adapter run: the base is loaded; the adapters start from PEFT's init or lora.init_from
    if (!s.lora_init_from.empty()) load_peft_adapter(s.lora_init_from, c.engine, world, rank == 0);
  } else if (!s.init_from.empty()) {
    Timer load_timer;
    runtime::run_agreed(world, [&] {  // a clear error before any collective read
      for (const std::string& f : ckpt::safetensors_files(s.init_from)) ckpt::read_safetensors_header(f);
    });
    ckpt::load_safetensors(s.init_from, c.engine, world);
    if (rank == 0) {
      std::printf("# initial weights from %s (checkpoint.init_from), read in %.2f s\n", s.init_from.c_str(),
                  load_timer.seconds());
      std::fflush(stdout);
    }
  }
  return sp;
}


// Before anything is written: this job's directories are locked and it knows which run it is;
// rank 0 prints a summary of the deck (the resolved deck is written once there is something to train).
ckpt::RunDirs claim_outputs(const deck::Deck& d, const RunSettings& rs, int rank, MPI_Comm world) {
  const TrainerSettings& s = rs.loop;
  if (rank == 0) {
    log::info(start_summary(d, s.out_dir));
    std::fputs(rs.schedule_note.c_str(), stdout);
  }
  ckpt::RunDirs run_dirs = ckpt::claim_run_dirs({s.out_dir, s.ckpt_dir, s.resume, s.previous_run, s.metrics_file}, world);
  if (rank == 0 && !run_dirs.notes.empty()) {
    std::fputs(run_dirs.notes.c_str(), stdout);
    std::fflush(stdout);
  }
  runtime::run_agreed(world, [&] {
    if (rank == 0) {
      ckpt::check_writable_dir(s.out_dir, "run.out_dir");  // exit 2 before any training
    }
  });
  return run_dirs;
}

// The training data for this rank, and what the checkpoints record about it (compared at resume;
// rank 0 reads it, every rank knows it).
struct TrainingData {
  std::unique_ptr<DataSource> source;
  std::string identity;
};
TrainingData open_training_data(const RunSettings& rs, const model::ModelSpec& spec, int rank, int size,
                                MPI_Comm world) {
  data::SamplerConfig scfg;
  scfg.global_batch = rs.batch.global_batch;
  scfg.micro_batches = static_cast<int>(rs.batch.grad_accum);
  scfg.seed = rs.loop.seed;
  scfg.rank = rank;
  scfg.world = size;
  scfg.leaf_group = rs.leaves.on ? rs.leaves.group : 0;
  TrainingData t;
  runtime::run_agreed(world, [&] { t.source = open_data(rs.loop.dataset, spec, scfg, spec.seq_len, rs.data_keys); });
  runtime::run_agreed(world, [&] {
    if (rank == 0) t.identity = data::data_identity(rs.loop.dataset, t.source->windows());
  });
  runtime::broadcast(world, t.identity, 0, "setup.data_identity");
  return t;
}

// Items per step and FLOPs per item for throughput and MFU (per token for language models, per
// image for a ViT: model::Model::train_flops_per_item), and the optimizer's host vectors, which
// the tensor count misses (tensor state is counted).
ThroughputModel throughput_model(const RunSettings& rs, const DataSource& data, const model::Model& net,
                                 const PeakFlops& peak, const fsdp::ShardedOptimizer& optimizer) {
  const bool lm = !data.classification();
  ThroughputModel tput;
  tput.items_per_step = rs.batch.global_batch * (lm ? data.tokens_per_item() : 1);
  tput.items_are_tokens = lm;
  tput.flops_per_item = net.train_flops_per_item();
  if (lm && data.attention_length() > 0)  // rows apart: per row token, each row's own attention
    tput.flops_per_item = net.train_flops_per_token(std::llround(data.attention_length()));
  tput.peak_tflops = peak.hardware();
  tput.matmul_tflops = peak.measured;
  tput.optim_state_bytes = optimizer.state_in_tensors() ? 0 : optimizer.state_bytes();
  return tput;
}

// Rank 0: the model, world, mesh, device, batch and throughput lines before the first step.
void print_run_banner(const ShardedJob& job, const RunSettings& rs, const DataSource& data, const fsdp::Engine& engine,
                      const Timer& wrap_timer, const PeakFlops& peak, int size) {
  const model::ModelSpec& spec = job.spec;
  const runtime::Topology& topo = job.topo;
  const fsdp::EngineOptions& eopts = job.engine_options;
  const BatchPlan& plan = rs.batch;
  const int64_t params = model::parameter_count(spec);
  const int threads = job.threads;
  std::printf("# model %s: %lld parameters (%.1f M); %d units; wrapped in %.2f s\n", spec.arch.c_str(),
              static_cast<long long>(params), params / 1e6, engine.num_units(), wrap_timer.seconds());
  if (spec.finetune.any()) {
    // What trains (model/lora.h): LoRA's adapters and lora.train_also, or all but train.freeze.
    const model::LoraSpec& l = spec.finetune.lora;
    const int64_t all = model::total_parameter_count(*job.net), trains = model::trainable_parameter_count(*job.net);
    std::printf("# %s: %lld of %lld parameters train (%.2f%%); the rest frozen (%s shards, no gradient or optimizer "
                "state)\n",
                l.on() ? log::fmt("LoRA r ", l.rank, ", alpha ", l.alpha, l.rslora ? " (rslora)" : "").c_str() : "train.freeze",
                static_cast<long long>(trains), static_cast<long long>(all), 100.0 * trains / std::max<int64_t>(all, 1),
                fsdp::dtype_name(eopts.mp.param_dtype));
  }
  std::printf("# world %d ranks (%d host%s%s), mesh %d replicate x %d shard, strategy %s, %s params, %d threads/rank\n",
              size, topo.num_hosts, topo.num_hosts == 1 ? "" : "s", topo.simulated ? ", simulated" : "",
              job.mesh->replicate_size(), job.mesh->shard_size(), fsdp::to_string(job.strategy),
              fsdp::dtype_name(eopts.mp.param_dtype), threads);
  if (!job.bf16_gemm.how.empty()) std::printf("%s\n", job.bf16_gemm.line().c_str());
  std::printf("# device %s (run.device = %s)%s; collectives %s\n", job.device.is_cuda() ? "cuda:<local rank>" : "cpu",
              rs.loop.device_key.c_str(),
              eopts.cpu_offload && job.device.is_cuda() ? ", shards and optimizer state in pinned host memory" : "",
              job.comms.world ? comm::to_string(job.comms.world->backend()) : "none");
  std::printf("# batch: global %lld = micro %lld x accum %lld x %d ranks; %s\n",
              static_cast<long long>(plan.global_batch), static_cast<long long>(plan.micro_batch),
              static_cast<long long>(plan.grad_accum), plan.dp_ranks, data.describe().c_str());
  if (rs.leaves.on)
    std::printf("# reproducible (train.reproducible): %lld leaves of %lld samples, %lld per rank, summed in one "
                "binary tree; %d thread%s per rank\n",
                static_cast<long long>(rs.leaves.leaves), static_cast<long long>(plan.micro_batch),
                static_cast<long long>(rs.leaves.per_rank), threads, threads == 1 ? "" : "s");
  std::printf("# %s; outputs in %s\n", peak.describe().c_str(), rs.loop.out_dir.c_str());
  if (!peak.warning().empty()) log::warn(peak.warning());
  std::fflush(stdout);
}

// train.reproducible's dependencies as JSON (stored with each checkpoint, compared at resume).
std::string run_guarantee(const RunSettings& rs, const ShardedJob& job) {
  if (!rs.leaves.on) return "";
  const bool bf16 = job.engine_options.mp.param_dtype == at::kBFloat16;
  return reproducibility_guarantee(rs.leaves, rs.batch.micro_batch, job.threads, job.device.str(),
                                   bf16 ? model::to_string(model::bf16_gemm()) : "")
      .dump();
}

// The run's metrics.jsonl, written by rank 0 (resumed_step >= 0: continuing the run's file, metrics.h).
std::unique_ptr<MetricsLog> open_metrics(const TrainerSettings& s, int64_t resumed_step, int rank, MPI_Comm world) {
  std::unique_ptr<MetricsLog> m;
  runtime::run_agreed(world, [&] {
    m = std::make_unique<MetricsLog>(s.out_dir + "/" + s.metrics_file, rank == 0 && !s.metrics_file.empty(),
                                     resumed_step, world);
  });
  return m;
}

bool training_finished(const TrainerSettings& s, const LoopPosition& p) {
  return p.step >= s.max_steps || (s.max_tokens > 0 && p.tokens_seen >= s.max_tokens);
}

}  // namespace

// open_sharded_job with its collectives watched (a cut link ends the job with exit 3).
ShardedJob open_watched_job(MPI_Comm world, const deck::Deck& d) {
  runtime::BlockingRegion region(world, "setup.groups");
  return open_sharded_job(world, d);
}

ckpt::SaveOptions save_options(const TrainerSettings& s) {
  ckpt::SaveOptions o;
  o.stuck_seconds = s.write_deadline_s;
  return o;
}

// The final state holds NaN/Inf (train.on_nonfinite = "continue" let it through): no final checkpoint.
int nonfinite_at_end(int rank) {
  if (rank == 0)
    log::error(log::fmt("training ended with NaN/Inf in the weights or optimizer state (train.on_nonfinite = "
                        "\"continue\"): no final checkpoint; exit ", int(kExitDiverged)));
  return kExitDiverged;
}

// A resumed run with no step left: rank 0 says so and how to go on.
bool finished_already(const StartPoint& start, const TrainerSettings& s, int rank) {
  if (start.resumed_step < 0 || !nothing_left(start.pos, s)) return false;
  if (rank == 0) {
    std::fputs(nothing_to_train_note(start.pos, s, start.from).c_str(), stdout);
    std::fflush(stdout);
  }
  return true;
}

// The resolved deck beside the run's records (written only when this job trains).
void write_resolved_deck(const deck::Deck& d, const std::string& out_dir, int rank, MPI_Comm world) {
  runtime::run_agreed(world, [&] {
    if (rank == 0) io::write_file_atomic(out_dir + "/deck.resolved.toml", d.resolved_toml());  // IoError: file and reason
  });
}

std::unique_ptr<comm::RegionWatch> watch_world_from_start(MPI_Comm world) {
  return comm::watch_regions(world, "world", deck::Deck::defaults().get_float("comm.timeout_s"));
}

int run_training(runtime::Runtime& rt, const deck::Deck& d, comm::RegionWatch& watch_world) {
  MPI_Comm world = rt.world();
  install_alloc_tracker();  // every CPU tensor allocation from here on (peak_tensor_bytes)
  optim::KokkosScope kokkos;
  install_stop_signal_handlers();
  // The run's keys, read once; the world's exchanges are watched with the deck's comm.timeout_s
  // from here (under the default one before: the deck's own agreement).
  RunSettings rs = run_settings_from_deck(d, world);
  watch_world.set_timeout(rs.comm.timeout_s);
  // Topology, mesh, device, communicators, the model on meta; then the batch plans for them.
  ShardedJob job = open_watched_job(world, d);
  const c10::Device device = job.device;
  c10::OptionalDeviceGuard device_guard(device.is_cuda() ? c10::optional<c10::Device>(device) : c10::nullopt);
  plan_run_batches(rs, d, job, world);
  // The deck against its dataset (packing, overlong rows), as `deck check` applies it: before
  // anything is written.
  runtime::run_agreed(world, [&] { check_data_rules(d, job.spec); });
  const TrainerSettings& s = rs.loop;
  const ckpt::RunDirs run_dirs = claim_outputs(d, rs, rt.rank(), world);
  const TrainingData data = open_training_data(rs, job.spec, rt.rank(), rt.size(), world);

  // The sharded model and its optimizer; throughput and the start-up lines.
  Timer wrap_timer;
  fsdp::Engine engine(*job.net, job.comms.engine(), job.engine_options, seeded_init(*job.net, s.seed));
  fsdp::ShardedOptimizer optimizer(engine, rs.optimizer);
  const PeakFlops peak = peak_flops(s.peak_tflops, job.engine_options.mp.param_dtype, device, job.threads, world);
  const ThroughputModel tput = throughput_model(rs, *data.source, *job.net, peak, optimizer);
  if (rt.rank() == 0) print_run_banner(job, rs, *data.source, engine, wrap_timer, peak, rt.size());

  // An adapter run's frozen base first: its checkpoints identify it instead of holding it.
  ckpt::CheckpointInfo info = checkpoint_info(job, d);
  std::optional<ckpt::BaseIdentity> base;
  if (is_adapter_run(job.spec)) {
    base = load_adapter_base(d, engine, world, /*verbose=*/true);
    info.base_json = base->json();
  }
  // Checkpoints: preflight (writable, room for one: exit 2 now, not after training), resume or start.
  ckpt::CheckpointManager ckpts(s.ckpt_dir, s.keep_last, world, s.async, save_options(s), run_dirs.run_id);
  const std::string guarantee = run_guarantee(rs, job);
  ckpt::preflight(ckpts.dir(), engine, optimizer, info, world);
  const StartPoint start = resume_or_start({s, run_dirs, ckpts, engine, optimizer, *data.source, rs.batch.global_batch,
                                            device, rt.rank(), rt.size(), world, guarantee, data.identity,
                                            base ? &*base : nullptr});
  // A finished run resumed changes none of its records: this returns before any is opened.
  if (finished_already(start, s, rt.rank())) return kExitOk;
  write_resolved_deck(d, s.out_dir, rt.rank(), world);

  // The loop's components, each deciding when to act.
  const std::unique_ptr<MetricsLog> metrics_log = open_metrics(s, start.resumed_step, rt.rank(), world);
  MetricsLog& metrics = *metrics_log;
  StepLogger logger(metrics, engine, tput, s.log_every, s.max_steps, world);
  DivergenceGuard divergence(s.on_nonfinite, rt.rank());
  Validator validator(*job.net, *data.source, metrics, s.val_every, s.val_batches, static_cast<int>(rs.batch.grad_accum),
                      s.max_steps, device, world);
  TextSampler sampler(s, *job.net, device, start.resumed_step, world);
  Checkpointer checkpointer(ckpts, engine, optimizer, info, SaveSchedule(s.every_steps, s.every_minutes, rt.rank()),
                            rs.batch.global_batch, s.seed, device, start.resumed_step, world);
  checkpointer.record_guarantee(guarantee);
  checkpointer.record_data_identity(data.identity);
  if (!start.data_change.empty()) metrics.log_event(start.resumed_step, "data_changed", start.data_change);
  const StepAgreement agree(world, checkpointer.schedule());
  const StepParts step{engine, optimizer, *job.net, *data.source, rs.schedule, rs.leaves, divergence, agree,
                       rs.batch.grad_accum, s.seed, s.grad_clip, device, rt.rank(), rt.size()};

  // The loop.
  LoopPosition pos = start.pos;
  int exit_code = kExitOk;
  bool diverged = false;
  while (!training_finished(s, pos)) {
    const StepResult r = train_step(step, pos);
    pos = {pos.step + 1, pos.tokens_seen + tput.items_per_step, data.source->next(pos.cursor)};
    logger.after_step(pos.step, pos.tokens_seen, r);
    if (divergence.gives_up(pos.step, r, logger.last_loss(), checkpointer.last_saved())) {
      diverged = true;  // no validation, no checkpoint of this state: the last good one stays the newest
      exit_code = kExitDiverged;
      break;
    }
    validator.after_step(pos.step);
    sampler.after_step(pos.step);
    if (checkpointer.after_step(pos, training_finished(s, pos), r.agreed)) {
      exit_code = kExitCheckpointed;
      break;
    }
  }
  if (!checkpointer.finish(pos, /*save_final=*/!diverged)) exit_code = nonfinite_at_end(rt.rank());
  metrics.write_summary(s.out_dir + "/summary.json", 2, logger.last_loss(), validator.last_loss(),
                        validator.last_accuracy(), !data.source->classification());
  return exit_code;
}

}  // namespace shardtrain::train
