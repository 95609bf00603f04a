// run_training: topology -> mesh -> comms -> sharded model -> data -> resume -> the step loop.
// The loop states the algorithm; its components (StepLogger, DivergenceGuard, Validator,
// TextSampler, Checkpointer) each decide for themselves whether to act at a step.
#include "shardtrain/train/trainer.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "checkpointer.h"
#include "data_identity.h"
#include "data_source.h"
#include "divergence.h"
#include "fault_hook.h"
#include "shardtrain/train/leaf_plan.h"
#include "loop_settings.h"
#include "resume_state.h"
#include "save_schedule.h"
#include "shardtrain/ckpt/manager.h"
#include "shardtrain/ckpt/preflight.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/model/bf16_gemm.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/train/alloc_tracker.h"
#include "shardtrain/train/job.h"
#include "shardtrain/train/metrics.h"
#include "shardtrain/train/peak_flops.h"
#include "shardtrain/train/run_dirs.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/train/signals.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"
#include "spec_json.h"
#include "start_report.h"
#include "step_logger.h"
#include "step_result.h"
#include "text_sampler.h"
#include "validator.h"

namespace shardtrain::train {
namespace {

// A step that runs out of memory is the deck's doing (batch, sequence, model, strategy), not a
// bug: one line naming what to change, exit 2, instead of a library trace and exit 1. It is
// raised on the ranks that ran out only, so the job aborts (the others wait in a collective).
template <typename F>
auto out_of_memory_is_user_error(int64_t step, F&& fn) -> decltype(fn()) {
  auto hint = [&](const std::string& what) {
    return UserError(log::fmt("step ", step, ": out of memory (", what.substr(0, what.find('\n')),
                              "): lower train.micro_batch (raise train.grad_accum to keep the global batch), "
                              "model.seq_len or the model size, or shard more (parallel.strategy = full_shard, "
                              "fsdp.activation_checkpointing = true); `shardtrain plan DECK --ranks N` estimates "
                              "the peak per rank"));
  };
  try {
    return fn();
  } catch (const std::bad_alloc& e) {
    throw hint(e.what());
  } catch (const c10::OutOfMemoryError& e) {
    throw hint(e.what());
  } catch (const c10::Error& e) {
    const std::string m = e.what();
    if (m.find("can't allocate memory") == std::string::npos && m.find("out of memory") == std::string::npos) throw;
    throw hint(m);
  }
}

struct StartPoint {
  LoopPosition pos;
  int64_t resumed_step = -1;  // -1: a fresh start
  std::string from;           // the checkpoint resumed from
  std::string data_change;    // what differs from the checkpoint's data (allowed by the deck)
};

// Resume (the newest usable checkpoint of this run, or the one named), else a fresh start
// from run.seed or checkpoint.init_from. Collective.
StartPoint resume_or_start(const TrainerSettings& s, const RunDirs& run_dirs, ckpt::CheckpointManager& ckpts,
                           fsdp::Engine& engine, fsdp::ShardedOptimizer& optimizer, const DataSource& data,
                           int64_t global_batch, const c10::Device& device, int rank, int size, MPI_Comm world,
                           const std::string& guarantee, const std::string& data_id) {
  StartPoint sp;
  std::string notes, data_change;
  // A candidate whose loop state cannot be restored (data cursor, generator states) is
  // skipped before any weight is loaded, like one that does not verify.
  auto restorable = [&](const std::string& path) {
    runtime::run_agreed(world, [&] {
      notes.clear();
      data_change.clear();
      try {
        const ckpt::TrainState st = ckpt::read_train_state(path);
        sp.pos = apply_train_state(st, path, global_batch, s.seed, rank, size, notes, device, guarantee);
        data.check_cursor(sp.pos.cursor);
        // Checked after the choice, not here: a checkpoint of other data is not a bad file
        // to set aside, and the resume must stop rather than fall back to an older one.
        const nlohmann::json extra = nlohmann::json::parse(st.extra_json, nullptr, false);
        if (extra.is_object() && extra.contains("data"))
          data_change = data_identity_differences(extra["data"].dump(), data_id);
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
    Timer load_timer;
    ckpt::TrainState st;
    const ckpt::IoStats io = ckpt::load_checkpoint(*from, engine, optimizer, st, world);
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
  if (!s.init_from.empty()) {
    Timer load_timer;
    runtime::run_agreed(world, [&] {  // a clear error before any collective read
      for (const std::string& f : ckpt::safetensors_files(s.init_from)) ckpt::read_safetensors_header(f);
    });
    ckpt::load_safetensors(s.init_from, engine, world);
    if (rank == 0) {
      std::printf("# initial weights from %s (checkpoint.init_from), read in %.2f s\n", s.init_from.c_str(),
                  load_timer.seconds());
      std::fflush(stdout);
    }
  }
  return sp;
}

}  // namespace

int run_training(runtime::Runtime& rt, const deck::Deck& d) {
  MPI_Comm world = rt.world();
  // Counts every CPU tensor allocation from here on (peak_tensor_bytes in the metrics).
  install_alloc_tracker();
  optim::KokkosScope kokkos;
  install_stop_signal_handlers();

  // ---- topology, mesh, device, communicators, the model on meta ----------------------
  ShardedJob job = open_sharded_job(world, d);
  const runtime::Topology& topo = job.topo;
  const runtime::DeviceMesh* mesh = job.mesh.get();
  const fsdp::Strategy strategy = job.strategy;
  const c10::Device device = job.device;
  const int threads = job.threads;
  // Torch's current device for this thread: where new CUDA tensors and streams belong.
  c10::OptionalDeviceGuard device_guard(device.is_cuda() ? c10::optional<c10::Device>(device) : c10::nullopt);

  // ---- settings: the deck is read here, once ------------------------------------------
  const model::ModelSpec& spec = job.spec;
  BatchPlan plan;
  optim::LrSchedule schedule;
  fsdp::OptimizerConfig opt_cfg;
  TrainerSettings s;
  LeafPlan leaves;
  std::string schedule_note;
  runtime::run_agreed(world, [&] {
    leaves = plan_leaves(d, rt.size(), rt.rank(), job.comms.shard ? job.comms.shard->size() : 1,
                         job.comms.world && job.comms.world->backend() == comm::Backend::Nccl);
    plan = plan_batches(d, rt.size());  // with leaves.on: leaves.per_rank micro-batches per rank
    check_fits_host_memory(d, spec, plan, world, device.is_cpu());  // huge seq_len / micro_batch: exit 2, not bad_alloc
    schedule = lr_schedule_from_deck(d, &schedule_note);
    opt_cfg = optimizer_config_from_deck(d);
    s = trainer_settings_from_deck(d);
  });
  const std::string& out_dir = s.out_dir;

  if (rt.rank() == 0) {
    log::info(start_summary(d, out_dir));
    std::fputs(schedule_note.c_str(), stdout);
  }
  // Before anything is written: this job's directories are locked and it knows which run it is.
  const RunDirs run_dirs = claim_run_dirs({out_dir, s.ckpt_dir, s.resume, s.previous_run, s.metrics_file}, world);
  if (rt.rank() == 0 && !run_dirs.notes.empty()) {
    std::fputs(run_dirs.notes.c_str(), stdout);
    std::fflush(stdout);
  }
  runtime::run_agreed(world, [&] {
    if (rt.rank() == 0) {
      ckpt::check_writable_dir(out_dir, "run.out_dir");  // exit 2 before any training
    }
  });

  // ---- data --------------------------------------------------------------------------
  data::SamplerConfig scfg;
  scfg.global_batch = plan.global_batch;
  scfg.micro_batches = static_cast<int>(plan.grad_accum);
  scfg.seed = s.seed;
  scfg.rank = rt.rank();
  scfg.world = rt.size();
  scfg.leaf_group = leaves.on ? leaves.group : 0;
  std::unique_ptr<DataSource> data;
  DataKeys data_keys;
  if (d.is_set("data.tokenizer")) data_keys.tokenizer = d.get_string("data.tokenizer");
  if (d.is_set("data.val_fraction")) data_keys.val_fraction = d.get_float("data.val_fraction");
  runtime::run_agreed(world, [&] { data = open_data(d.get_string("data.dataset"), spec, scfg, spec.seq_len, data_keys); });
  // What the checkpoints record about the data, compared at resume (rank 0 reads, all know).
  std::string data_id;
  runtime::run_agreed(world, [&] {
    if (rt.rank() == 0) data_id = data_identity(s.dataset);
  });
  {
    int64_t n = static_cast<int64_t>(data_id.size());
    ST_MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT64_T, 0, world));
    data_id.resize(static_cast<size_t>(n));
    ST_MPI_CHECK(MPI_Bcast(data_id.data(), static_cast<int>(n), MPI_CHAR, 0, world));
  }

  // ---- engine ------------------------------------------------------------------------
  std::shared_ptr<model::Model> net = job.net;
  const fsdp::EngineOptions& eopts = job.engine_options;
  Timer wrap_timer;
  fsdp::Engine engine(*net, job.comms.engine(), eopts, seeded_init(*net, s.seed));
  fsdp::ShardedOptimizer optimizer(engine, opt_cfg);
  const int64_t params = model::parameter_count(spec);

  const PeakFlops peak = peak_flops(s.peak_tflops, eopts.mp.param_dtype, device, threads, world);
  const bool lm = !data->classification();
  ThroughputModel tput;
  tput.items_per_step = plan.global_batch * (lm ? data->tokens_per_item() : 1);
  tput.items_are_tokens = lm;
  // Per token for language models, per image for a ViT (model::Model::train_flops_per_item).
  tput.flops_per_item = net->train_flops_per_item();
  tput.peak_tflops = peak.hardware();
  tput.matmul_tflops = peak.measured;
  // Host vectors of the Kokkos kernels, which the tensor count misses (tensor state is counted).
  tput.optim_state_bytes = optimizer.state_in_tensors() ? 0 : optimizer.state_bytes();

  if (rt.rank() == 0) {
    std::printf("# model %s: %lld parameters (%.1f M); %d units; wrapped in %.2f s\n", spec.arch.c_str(),
                static_cast<long long>(params), params / 1e6, engine.num_units(), wrap_timer.seconds());
    std::printf("# world %d ranks (%d host%s%s), mesh %d replicate x %d shard, strategy %s, %s params, %d threads/rank\n",
                rt.size(), topo.num_hosts, topo.num_hosts == 1 ? "" : "s", topo.simulated ? ", simulated" : "",
                mesh->replicate_size(), mesh->shard_size(), fsdp::to_string(strategy),
                fsdp::dtype_name(eopts.mp.param_dtype), threads);
    if (!job.bf16_gemm.how.empty()) std::printf("%s\n", job.bf16_gemm.line().c_str());
    std::printf("# device %s (run.device = %s)%s; collectives %s\n", device.is_cuda() ? "cuda:<local rank>" : "cpu",
                s.device_key.c_str(),
                eopts.cpu_offload && device.is_cuda() ? ", shards and optimizer state in pinned host memory" : "",
                job.comms.world ? comm::to_string(job.comms.world->backend()) : "none");
    std::printf("# batch: global %lld = micro %lld x accum %lld x %d ranks; %s\n",
                static_cast<long long>(plan.global_batch), static_cast<long long>(plan.micro_batch),
                static_cast<long long>(plan.grad_accum), plan.dp_ranks, data->describe().c_str());
    if (leaves.on)
      std::printf("# reproducible (train.reproducible): %lld leaves of %lld samples, %lld per rank, summed in one "
                  "binary tree; %d thread%s per rank\n",
                  static_cast<long long>(leaves.leaves), static_cast<long long>(plan.micro_batch),
                  static_cast<long long>(leaves.per_rank), threads, threads == 1 ? "" : "s");
    std::printf("# %s; outputs in %s\n", peak.describe().c_str(), out_dir.c_str());
    if (!peak.warning().empty()) log::warn(peak.warning());
    std::fflush(stdout);
  }

  // ---- checkpoints: resume or start ---------------------------------------------------
  ckpt::SaveOptions save_opts;
  save_opts.stuck_seconds = s.write_deadline_s;
  ckpt::CheckpointManager ckpts(s.ckpt_dir, s.keep_last, world, s.async, save_opts, run_dirs.run_id);
  const ckpt::CheckpointInfo info = checkpoint_info(job, d);
  const std::string guarantee =
      leaves.on ? reproducibility_guarantee(leaves, plan.micro_batch, threads, device.str(),
                                            eopts.mp.param_dtype == at::kBFloat16 ? model::to_string(model::bf16_gemm()) : "")
                      .dump()
                : std::string();
  // Writable checkpoint dir, a regular `latest`, room for one checkpoint: exit 2 now, not after training.
  ckpt::preflight(ckpts.dir(), engine, optimizer, info, world);
  const StartPoint start = resume_or_start(s, run_dirs, ckpts, engine, optimizer, *data, plan.global_batch, device,
                                           rt.rank(), rt.size(), world, guarantee, data_id);
  LoopPosition pos = start.pos;
  // A finished run resumed: nothing to do, and nothing of its records (metrics, summary,
  // resolved deck, checkpoints) may change, so this returns before any of them is opened.
  if (start.resumed_step >= 0 && nothing_left(pos, s)) {
    if (rt.rank() == 0) {
      std::fputs(nothing_to_train_note(pos, s, start.from).c_str(), stdout);
      std::fflush(stdout);
    }
    return kExitOk;
  }
  runtime::run_agreed(world, [&] {
    if (rt.rank() == 0)
      io::write_file_atomic(out_dir + "/deck.resolved.toml", d.resolved_toml());  // IoError: file and reason
  });

  // ---- the loop's components ----------------------------------------------------------
  std::unique_ptr<MetricsLog> metrics_log;
  runtime::run_agreed(world, [&] {
    metrics_log = std::make_unique<MetricsLog>(out_dir + "/" + s.metrics_file, rt.rank() == 0 && !s.metrics_file.empty(),
                                               start.resumed_step, world);
  });
  MetricsLog& metrics = *metrics_log;
  StepLogger logger(metrics, engine, tput, s.log_every, s.max_steps, world);
  DivergenceGuard divergence(s.on_nonfinite, rt.rank());
  Validator validator(*net, *data, metrics, s.val_every, s.val_batches, static_cast<int>(plan.grad_accum), s.max_steps,
                      device, world);
  TextSampler sampler(s, *net, device, start.resumed_step, world);
  Checkpointer checkpointer(ckpts, engine, optimizer, info, SaveSchedule(s.every_steps, s.every_minutes, rt.rank(), world),
                            plan.global_batch, s.seed, device, start.resumed_step, world);
  checkpointer.record_guarantee(guarantee);
  checkpointer.record_data_identity(data_id);
  if (!start.data_change.empty()) metrics.log_event(start.resumed_step, "data_changed", start.data_change);

  // One optimizer step over the global batch at `pos`: forward/backward per micro-batch,
  // clipping, the agreed finiteness test, the update (unless the guard withholds it).
  const bool masked = data->masked();
  auto train_step = [&](const LoopPosition& at) {
    StepResult r;
    Timer step_timer;
    const double comm_before = engine.memory().exposed_comm_seconds;
    r.lr = schedule.lr_at(at.step);
    engine.zero_grad();
    // Summed on the device: reading each micro-batch's loss would stall the host (and with
    // it the next micro-batch's launches) on every micro-batch.
    at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
    // The step's micro-batches read up front, in one agreement: an id >= vocab_size on any rank
    // is one UserError (file, offset) on every rank, for one collective per step.
    std::vector<Batch> batches(static_cast<size_t>(plan.grad_accum));
    int64_t counted = 0;  // instruction data: the global batch's counted targets
    runtime::run_agreed(world, [&] {
      for (int mb = 0; mb < plan.grad_accum; ++mb) batches[mb] = data->train_batch(at.cursor, mb);
      if (masked) counted = data->counted_targets(at.cursor);
    });
    // Reproducible: each micro-batch is a leaf; its loss is scaled by 1 / leaves (the engine
    // sums), its dropout keyed by the leaf, and the losses summed in leaf order.
    const double scale = static_cast<double>(leaves.on ? leaves.leaves : plan.grad_accum);
    // A loss mask: the step's loss is the mean over the counted targets of the whole global
    // batch, so each micro-batch's summed loss is divided by the global count N, whatever its
    // own count. The engine averages over the world's ranks in the default mode (multiply by
    // the world size to undo that) and sums in the reproducible mode (leaf sum / N, the same
    // bits at every world size). N = 0 (no counted target): loss 0, gradient 0.
    const double per_counted = 1.0 / static_cast<double>(std::max<int64_t>(counted, 1));
    const double mask_scale = leaves.on ? per_counted : static_cast<double>(rt.size()) * per_counted;
    std::vector<at::Tensor> leaf_losses;
    for (int mb = 0; mb < plan.grad_accum; ++mb) {
      engine.set_last_micro_batch(mb == plan.grad_accum - 1);
      if (leaves.on) seed_leaf_generator(s.seed, at.step, leaves.leaf_of(mb), device);
      const Batch b = on_device(std::move(batches[mb]), device);
      if (masked) {
        const at::Tensor sum = net->loss_sum(b.inputs, b.targets);
        (sum * mask_scale).backward();
        if (leaves.on) leaf_losses.push_back(sum.detach().to(at::kDouble));
        else loss_sum.add_(sum.detach().to(at::kDouble));
        continue;
      }
      const at::Tensor mean = net->loss(b.inputs, b.targets);
      at::Tensor loss = mean / scale;
      loss.backward();
      if (leaves.on) leaf_losses.push_back(mean.detach().to(at::kDouble));
      else loss_sum.add_(loss.detach().to(at::kDouble));
    }
    if (leaves.on) {
      const at::Tensor l = at::stack(leaf_losses).cpu();
      const std::vector<double> mine(l.data_ptr<double>(), l.data_ptr<double>() + l.numel());
      // Masked: the leaves' summed losses added in leaf order, over N.
      r.local_loss = masked ? sum_over_leaves(mine, leaves, world) * per_counted : mean_over_leaves(mine, leaves, world);
      r.loss_is_global = true;
    } else if (masked) {
      // The step logger averages over ranks: this rank's share times the world size.
      r.local_loss = loss_sum.item<double>() * static_cast<double>(rt.size()) * per_counted;
    } else {
      r.local_loss = loss_sum.item<double>();
    }
    fault_pause("mid_step", at.step + 1, rt.rank());
    r.grad_norm = engine.clip_grad_norm(s.grad_clip);
    // Decided by every rank together, before the update could carry NaN into the weights.
    r.finite = step_is_finite(r.local_loss, r.grad_norm, world);
    if (divergence.apply_update(r.finite)) optimizer.step(r.lr);
    r.seconds = step_timer.seconds();
    r.comm_seconds = engine.memory().exposed_comm_seconds - comm_before;
    return r;
  };
  auto advance = [&](LoopPosition& p) {
    p.cursor = data->next(p.cursor);
    ++p.step;
    p.tokens_seen += tput.items_per_step;
  };
  auto finished = [&](const LoopPosition& p) {
    return p.step >= s.max_steps || (s.max_tokens > 0 && p.tokens_seen >= s.max_tokens);
  };

  // ---- the loop ----------------------------------------------------------------------
  int exit_code = kExitOk;
  bool diverged = false;
  while (!finished(pos)) {
    const StepResult r = out_of_memory_is_user_error(pos.step + 1, [&] { return train_step(pos); });
    advance(pos);
    logger.after_step(pos.step, pos.tokens_seen, r);
    if (divergence.gives_up(pos.step, r, logger.last_loss(), checkpointer.last_saved())) {
      diverged = true;  // no validation, no checkpoint of this state: the last good one stays the newest
      exit_code = kExitDiverged;
      break;
    }
    validator.after_step(pos.step);
    sampler.after_step(pos.step);
    if (checkpointer.after_step(pos, finished(pos))) {
      exit_code = kExitCheckpointed;
      break;
    }
  }
  if (!checkpointer.finish(pos, /*save_final=*/!diverged)) {
    if (rt.rank() == 0)
      log::error(log::fmt("training ended with NaN/Inf in the weights or optimizer state (train.on_nonfinite = "
                          "\"continue\"): no final checkpoint; exit ", int(kExitDiverged)));
    exit_code = kExitDiverged;
  }
  metrics.write_summary(out_dir + "/summary.json", 2, logger.last_loss(), validator.last_loss(),
                        validator.last_accuracy(), lm);
  return exit_code;
}

}  // namespace shardtrain::train
