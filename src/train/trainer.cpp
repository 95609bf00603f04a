// run_training: topology -> mesh -> comms -> sharded model -> data -> resume -> the step loop
// (with checkpoints every N steps / M minutes, on SIGUSR1/SIGTERM and at the end).
#include "shardtrain/train/trainer.h"

#include <ATen/Parallel.h>
#include <sys/stat.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include "data_source.h"
#include "fault_hook.h"
#include "resume_state.h"
#include "save_schedule.h"
#include "shardtrain/ckpt/manager.h"
#include "shardtrain/ckpt/tools.h"
#include "spec_json.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/train/alloc_tracker.h"
#include "shardtrain/train/job.h"
#include "shardtrain/train/metrics.h"
#include "shardtrain/train/peak_flops.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/train/signals.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/memory.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"

namespace shardtrain::train {
namespace {

void make_dirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty()) {
        struct stat st {};
        if (stat(cur.c_str(), &st) != 0) {
          ST_USER_CHECK(mkdir(cur.c_str(), 0755) == 0 || errno == EEXIST, "cannot create directory '", cur, "'");
        } else {
          ST_USER_CHECK(S_ISDIR(st.st_mode), "'", cur, "' exists and is not a directory");
        }
      }
    }
    if (i < path.size()) cur += path[i];
  }
}

double allreduce(double v, MPI_Op op, MPI_Comm c) {
  double out = 0;
  ST_MPI_CHECK(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, op, c));
  return out;
}

struct EvalResult {
  double loss = 0;
  std::optional<double> acc;
};

// Mean loss (and accuracy) over the validation batches, every rank its own part.
// A batch on the compute device (the data sources build them in host memory).
Batch on_device(Batch b, const c10::Device& device) {
  if (device.is_cpu()) return b;
  return {b.inputs.to(device, /*non_blocking=*/true), b.targets.to(device, /*non_blocking=*/true)};
}

EvalResult evaluate(model::Model& m, const DataSource& data, int64_t max_batches, int micro_batches,
                    const c10::Device& device, MPI_Comm world) {
  torch::autograd::AutoGradMode no_grad(false);
  int64_t n = data.val_batches();
  if (max_batches > 0) n = std::min(n, max_batches);
  double sums[3] = {0, 0, 0};  // loss x items, items, correct
  for (int64_t i = 0; i < n; ++i) {
    for (int mb = 0; mb < micro_batches; ++mb) {
      Batch b = on_device(data.val_batch(i, mb), device);
      at::Tensor logits = m.forward(b.inputs).to(at::kFloat);
      at::Tensor flat = logits.reshape({-1, logits.size(-1)});
      at::Tensor tgt = b.targets.reshape({-1});
      sums[0] += at::cross_entropy_loss(flat, tgt).item<double>() * tgt.numel();
      sums[1] += static_cast<double>(tgt.numel());
      if (data.classification()) sums[2] += flat.argmax(-1).eq(tgt).sum().item<double>();
    }
  }
  double tot[3];
  ST_MPI_CHECK(MPI_Allreduce(sums, tot, 3, MPI_DOUBLE, MPI_SUM, world));
  EvalResult r;
  if (tot[1] == 0) return r;
  r.loss = tot[0] / tot[1];
  if (data.classification()) r.acc = tot[2] / tot[1];
  return r;
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

  // ---- settings ----------------------------------------------------------------------
  const model::ModelSpec& spec = job.spec;
  BatchPlan plan;
  optim::LrSchedule schedule;
  fsdp::OptimizerConfig opt_cfg;
  std::string out_dir;
  runtime::run_agreed(world, [&] {
    plan = plan_batches(d, rt.size());
    schedule = lr_schedule_from_deck(d);
    opt_cfg = optimizer_config_from_deck(d);
    out_dir = d.out_dir();
  });
  const int64_t max_steps = d.get_int("train.max_steps"), max_tokens = d.get_int("train.max_tokens");
  const int64_t log_every = d.get_int("log.every"), val_every = d.get_int("train.val_every");
  const uint64_t seed = static_cast<uint64_t>(d.get_int("run.seed"));

  if (rt.rank() == 0) {
    log::info("# shardtrain train: resolved deck (" + d.source() + ")");
    log::info(d.resolved_toml());
  }
  runtime::run_agreed(world, [&] {
    if (rt.rank() == 0) {
      make_dirs(out_dir);
      std::ofstream f(out_dir + "/deck.resolved.toml");
      ST_USER_CHECK(f.good(), "cannot write '", out_dir, "/deck.resolved.toml'");
      f << d.resolved_toml();
    }
  });

  // ---- data --------------------------------------------------------------------------
  data::SamplerConfig scfg;
  scfg.global_batch = plan.global_batch;
  scfg.micro_batches = static_cast<int>(plan.grad_accum);
  scfg.seed = seed;
  scfg.rank = rt.rank();
  scfg.world = rt.size();
  std::unique_ptr<DataSource> data;
  DataKeys data_keys;
  if (d.is_set("data.tokenizer")) data_keys.tokenizer = d.get_string("data.tokenizer");
  if (d.is_set("data.val_fraction")) data_keys.val_fraction = d.get_float("data.val_fraction");
  runtime::run_agreed(world, [&] { data = open_data(d.get_string("data.dataset"), spec, scfg, spec.seq_len, data_keys); });

  // ---- engine ------------------------------------------------------------------------
  std::shared_ptr<model::Model> net = job.net;
  const fsdp::EngineOptions& eopts = job.engine_options;
  Timer wrap_timer;
  fsdp::Engine engine(*net, job.comms.engine(), eopts, seeded_init(*net, seed));
  fsdp::ShardedOptimizer optimizer(engine, opt_cfg);
  // Host vectors of the Kokkos kernels, which the tensor count misses (tensor state is counted).
  const int64_t optim_state_bytes = optimizer.state_in_tensors() ? 0 : optimizer.state_bytes();
  const int64_t params = model::parameter_count(spec);

  const double peak_tflops = d.get_float("log.peak_tflops") > 0
                                 ? d.get_float("log.peak_tflops")
                                 : allreduce(measure_peak_tflops(eopts.mp.param_dtype, device), MPI_MIN, world);
  const bool lm = !data->classification();
  const int64_t items_per_step = plan.global_batch * (lm ? data->tokens_per_item() : 1);
  // Per token for language models, per image for a ViT (model::Model::train_flops_per_item).
  const double flops_per_item = net->train_flops_per_item();

  if (rt.rank() == 0) {
    std::printf("# model %s: %lld parameters (%.1f M); %d units; wrapped in %.2f s\n", spec.arch.c_str(),
                static_cast<long long>(params), params / 1e6, engine.num_units(), wrap_timer.seconds());
    std::printf("# world %d ranks (%d host%s%s), mesh %d replicate x %d shard, strategy %s, %s params, %d threads/rank\n",
                rt.size(), topo.num_hosts, topo.num_hosts == 1 ? "" : "s", topo.simulated ? ", simulated" : "",
                mesh->replicate_size(), mesh->shard_size(), fsdp::to_string(strategy),
                fsdp::dtype_name(eopts.mp.param_dtype), threads);
    std::printf("# device %s (run.device = %s)%s; collectives %s\n", device.is_cuda() ? "cuda:<local rank>" : "cpu",
                d.get_string("run.device").c_str(),
                eopts.cpu_offload && device.is_cuda() ? ", shards and optimizer state in pinned host memory" : "",
                job.comms.world ? comm::to_string(job.comms.world->backend()) : "none");
    std::printf("# batch: global %lld = micro %lld x accum %lld x %d ranks; %s\n",
                static_cast<long long>(plan.global_batch), static_cast<long long>(plan.micro_batch),
                static_cast<long long>(plan.grad_accum), plan.dp_ranks, data->describe().c_str());
    std::printf("# peak %.3f TFLOP/s per rank (%s); outputs in %s\n", peak_tflops,
                d.get_float("log.peak_tflops") > 0 ? "log.peak_tflops" : "measured matmul", out_dir.c_str());
    std::fflush(stdout);
  }

  // ---- checkpoints: resume ----------------------------------------------------------
  const int64_t every_steps = d.get_int("checkpoint.every_steps");
  const bool async_ckpt = d.get_bool("checkpoint.async");
  ckpt::CheckpointManager ckpts(d.checkpoint_dir(), static_cast<int>(d.get_int("checkpoint.keep_last")), world,
                                async_ckpt);
  ckpt::CheckpointInfo info;
  info.deck_text = d.resolved_toml();
  info.model_spec_json = model_spec_json(spec);
  info.strategy = fsdp::to_string(strategy);
  info.shard_group_size = mesh->shard_size();
  info.replicate_size = mesh->replicate_size();

  LoopPosition pos;
  int64_t resumed_step = -1;
  const std::optional<std::string> resume_from = ckpts.find_resume(d.get_string("checkpoint.resume"));
  if (resume_from) {
    Timer load_timer;
    ckpt::TrainState st;
    const ckpt::IoStats io = ckpt::load_checkpoint(*resume_from, engine, optimizer, st, world);
    std::string notes;
    ckpt::CheckpointMeta meta;
    runtime::run_agreed(world, [&] {
      pos = apply_train_state(st, *resume_from, plan.global_batch, seed, rt.rank(), rt.size(), notes, device);
      data->check_cursor(pos.cursor);
      if (rt.rank() == 0) meta = ckpt::read_checkpoint_meta(*resume_from);
    });
    resumed_step = pos.step;
    if (rt.rank() == 0) {
      std::printf("# resumed from %s: step %lld, %lld tokens seen, data epoch %lld position %lld; written by %lld "
                  "ranks (%s, %lld replicate x %lld shard) at %s; loaded %.1f MB in %.2f s\n%s",
                  resume_from->c_str(), static_cast<long long>(pos.step), static_cast<long long>(pos.tokens_seen),
                  static_cast<long long>(pos.cursor.epoch), static_cast<long long>(pos.cursor.position),
                  static_cast<long long>(meta.world_size), meta.strategy.c_str(),
                  static_cast<long long>(meta.replicate_size), static_cast<long long>(meta.shard_group_size),
                  meta.created.c_str(), io.bytes / 1e6, load_timer.seconds(), notes.c_str());
      if (pos.step >= max_steps) std::printf("# checkpoint step %lld >= train.max_steps %lld: nothing to train\n",
                                             static_cast<long long>(pos.step), static_cast<long long>(max_steps));
      std::fflush(stdout);
    }
  } else {
    seed_default_generator(seed, rt.rank(), device);
    if (rt.rank() == 0) {
      std::printf("# starting fresh (checkpoint.resume = \"%s\"); checkpoints in %s\n",
                  d.get_string("checkpoint.resume").c_str(), ckpts.dir().c_str());
      std::fflush(stdout);
    }
    const std::string init_from = d.get_string("checkpoint.init_from");
    if (!init_from.empty()) {
      Timer load_timer;
      runtime::run_agreed(world, [&] {  // a clear error before any collective read
        for (const std::string& f : ckpt::safetensors_files(init_from)) ckpt::read_safetensors_header(f);
      });
      ckpt::load_safetensors(init_from, engine, world);
      if (rt.rank() == 0) {
        std::printf("# initial weights from %s (checkpoint.init_from), read in %.2f s\n", init_from.c_str(),
                    load_timer.seconds());
        std::fflush(stdout);
      }
    }
  }

  const std::string metrics_file = d.get_string("log.metrics_file");
  std::unique_ptr<MetricsLog> metrics_log;
  runtime::run_agreed(world, [&] {
    metrics_log = std::make_unique<MetricsLog>(out_dir + "/" + metrics_file, rt.rank() == 0 && !metrics_file.empty(),
                                               resumed_step);
  });
  MetricsLog& metrics = *metrics_log;
  SaveSchedule schedule_saves(every_steps, d.get_float("checkpoint.every_minutes"), rt.rank(), world);
  int64_t last_saved = resumed_step;

  // Collective. The TrainState is taken after the step's data cursor advanced and after
  // validation, i.e. exactly where the next invocation's loop starts.
  auto save = [&](int64_t at_step, const std::string& why) {
    Timer save_timer;
    const ckpt::TrainState st = make_train_state(pos, plan.global_batch, seed, world, device);
    const std::string path = ckpts.save(at_step, engine, optimizer, st, info);
    last_saved = at_step;
    schedule_saves.saved();
    if (rt.rank() == 0) {
      std::printf("checkpoint: step %lld -> %s (%s; %s %.2f s)\n", static_cast<long long>(at_step), path.c_str(),
                  why.c_str(), async_ckpt ? "blocked" : "wrote in", save_timer.seconds());
      std::fflush(stdout);
    }
  };

  // ---- the loop ----------------------------------------------------------------------
  data::SamplerCursor& cursor = pos.cursor;
  int64_t& step = pos.step;
  int64_t& tokens_seen = pos.tokens_seen;
  double last_loss = 0;
  std::optional<double> last_val, last_acc;
  double window_s = 0, window_comm = 0;
  int64_t window_steps = 0;
  int exit_code = kExitOk;

  while (step < max_steps && (max_tokens <= 0 || tokens_seen < max_tokens)) {
    Timer step_timer;
    const double comm_before = engine.memory().exposed_comm_seconds;
    const float lr = schedule.lr_at(step);
    engine.zero_grad();
    // Summed on the device: reading each micro-batch's loss would stall the host (and with
    // it the next micro-batch's launches) on every micro-batch.
    at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
    for (int mb = 0; mb < plan.grad_accum; ++mb) {
      engine.set_last_micro_batch(mb == plan.grad_accum - 1);
      Batch b = on_device(data->train_batch(cursor, mb), device);
      at::Tensor loss = net->loss(b.inputs, b.targets) / static_cast<double>(plan.grad_accum);
      loss.backward();
      loss_sum.add_(loss.detach().to(at::kDouble));
    }
    const double local_loss = loss_sum.item<double>();
    fault_pause("mid_step", step + 1, rt.rank());
    const double grad_norm = engine.clip_grad_norm(d.get_float("optimizer.grad_clip"));
    optimizer.step(lr);
    cursor = data->next(cursor);
    ++step;
    if (lm) tokens_seen += items_per_step;
    else tokens_seen += plan.global_batch;
    window_s += step_timer.seconds();
    window_comm += engine.memory().exposed_comm_seconds - comm_before;
    ++window_steps;

    const bool log_now = step % log_every == 0 || step == max_steps || step == 1;
    if (log_now) {
      last_loss = allreduce(local_loss, MPI_SUM, world) / rt.size();
      const double step_s = allreduce(window_s / window_steps, MPI_MAX, world);
      const double comm_s = allreduce(window_comm / window_steps, MPI_MAX, world);
      StepRecord r;
      r.step = step;
      r.max_steps = max_steps;
      r.loss = last_loss;
      r.lr = lr;
      r.grad_norm = grad_norm;
      r.items_per_s = items_per_step / step_s;
      r.items_are_tokens = lm;
      r.step_ms = 1e3 * step_s;
      r.tflops = flops_per_item * (lm ? items_per_step : plan.global_batch) / step_s / rt.size() / 1e12;
      r.mfu = peak_tflops > 0 ? r.tflops / peak_tflops : 0;
      r.comm_share = step_s > 0 ? comm_s / step_s : 0;
      r.peak_mem_bytes = static_cast<int64_t>(allreduce(static_cast<double>(read_process_memory().hwm_bytes), MPI_MAX, world));
      r.peak_tensor_bytes = static_cast<int64_t>(
          allreduce(static_cast<double>(alloc_counters().peak_bytes + optim_state_bytes), MPI_MAX, world));
      // The CUDA caching allocator's max_memory_allocated (-1 on a CPU device: not logged).
      r.peak_device_bytes = static_cast<int64_t>(
          allreduce(static_cast<double>(engine.memory().device_peak_allocated_bytes), MPI_MAX, world));
      r.tokens_seen = tokens_seen;
      metrics.log_step(r);
      window_s = window_comm = 0;
      window_steps = 0;
    }
    if (val_every > 0 && (step % val_every == 0 || step == max_steps) && data->val_batches() > 0) {
      EvalResult e = evaluate(*net, *data, d.get_int("train.val_batches"), static_cast<int>(plan.grad_accum), device, world);
      last_val = e.loss;
      last_acc = e.acc;
      metrics.log_eval({step, e.loss, e.acc});
    }
    // Checkpoint and stop requests: every rank must agree on the same step boundary.
    const bool finished = step >= max_steps || (max_tokens > 0 && tokens_seen >= max_tokens);
    const SaveSchedule::Decision dec = schedule_saves.poll(step, finished);
    if (dec.stop && rt.rank() == 0)
      log::info(log::fmt("stop requested (signal ", dec.signal, ") at step ", step,
                         finished ? ": training is finished anyway" : ": checkpointing, then exit 42 (requeue me)"));
    if (dec.save) save(step, dec.reason);
    if (dec.stop && !finished) {
      exit_code = kExitCheckpointed;
      break;
    }
  }
  // Every way out of the loop above has saved its step; this keeps a future exit path from
  // ending a run without its final checkpoint.
  if (step > 0 && last_saved != step) save(step, "final");
  ckpts.wait();  // a background save must be committed before the exit code promises it
  metrics.write_summary(out_dir + "/summary.json", 2, last_loss, last_val, last_acc, lm);
  return exit_code;
}

}  // namespace shardtrain::train
