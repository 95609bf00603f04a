// import_safetensors: deck -> sharded model on meta -> slices read from safetensors -> checkpoint at step 0.
#include "shardtrain/model_io/import.h"
#include "shardtrain/train/adapter_base.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/train/job.h"
#include "shardtrain/train/resume_state.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/timer.h"
#include "spec_from_json.h"

namespace shardtrain::model_io {

std::vector<std::string> safetensors_inputs(const std::string& in) {
  namespace fs = std::filesystem;
  std::vector<std::string> inputs = ckpt::safetensors_files(in);
  inputs.push_back(in);
  std::error_code ec;
  if (fs::is_directory(in, ec)) inputs.push_back((fs::path(in) / "model.safetensors.index.json").string());
  return inputs;
}

void import_safetensors(runtime::Runtime& rt, const deck::Deck& d, const std::string& in, const std::string& out) {
  MPI_Comm world = rt.world();
  optim::KokkosScope kokkos;
  Timer timer;
  fsdp::OptimizerConfig opt_cfg;
  runtime::run_agreed(world, [&] {
    // The output must not be the input (or one of an index's member files).
    ckpt::refuse_overwriting_inputs(out, safetensors_inputs(in), "ckpt import");
    // Checked before any work: the header is parsed on every rank (cheap), so a bad file is
    // reported before the model is built.
    for (const std::string& f : ckpt::safetensors_files(in)) ckpt::read_safetensors_header(f);
    opt_cfg = train::optimizer_config_from_deck(d);
  });
  // On the host whatever run.device says: the import only moves bytes from file to file.
  train::JobOptions jo;
  jo.host_only = true;
  train::ShardedJob job = train::open_sharded_job(world, d, jo);
  const model::ModelSpec& spec = job.spec;
  const fsdp::Strategy strategy = job.strategy;
  const runtime::DeviceMesh* mesh = job.mesh.get();
  // Every parameter's name, dtype and shape against the file, on the model as built on the meta
  // device (linear in its layers; a config.json beside the weights was held to them when the spec
  // was read), before the engine allocates a shard. A LoRA model's base: all but the adapters.
  runtime::run_agreed(world, [&] {
    std::vector<ckpt::ExpectedTensor> base;
    for (const auto& p : job.net->named_parameters())
      if (!model::is_lora_param(p.key())) base.push_back({p.key(), p.value().sizes().vec()});
    ckpt::match_safetensors(in, train::is_adapter_run(spec) ? base : expected_tensors(*job.net));
  });
  const uint64_t seed = static_cast<uint64_t>(d.get_int("run.seed"));
  // Every parameter is overwritten by the import (zeros are the cheapest placeholder), but a LoRA
  // model's adapters, which start as a fresh run's (run.seed's init, or lora.init_from's).
  const bool adapter = train::is_adapter_run(spec);
  fsdp::Engine engine(*job.net, job.comms.engine(), job.engine_options,
                      adapter ? train::seeded_init(*job.net, seed) : [](const std::string&, at::Tensor& t) { t.zero_(); });
  fsdp::ShardedOptimizer optimizer(engine, opt_cfg);
  ckpt::CheckpointInfo info = train::checkpoint_info(job, d);
  if (adapter) {
    // An adapter checkpoint at step 0: `in` is its base (the deck's checkpoint.init_from, as the
    // CLI sets it), identified, not stored.
    info.base_json = train::load_adapter_base(d, engine, world, /*verbose=*/false).json();
    std::string adapters;
    runtime::run_agreed(world, [&] { adapters = d.get_string("lora.init_from"); });
    if (!adapters.empty()) train::load_peft_adapter(adapters, engine, world, /*verbose=*/false);
  } else {
    ckpt::load_safetensors(in, engine, world);
  }

  train::seed_default_generator(seed, rt.rank());  // what a fresh run starts with
  // The batch plan is not checked here: the import may run at another rank count than the
  // training; the deck's global batch is recorded only for the resume note.
  const ckpt::TrainState st =
      train::make_train_state(train::LoopPosition{}, d.get_int("train.global_batch"), seed, world);
  const ckpt::IoStats io = ckpt::save_checkpoint(out, engine, optimizer, st, info, world);
  if (rt.rank() == 0) {
    std::printf("imported %s -> %s: %s, %lld parameters, %d ranks (%s, %d replicate x %d shard); wrote %.1f MB in %.2f s\n",
                in.c_str(), out.c_str(), spec.arch.c_str(), static_cast<long long>(model::parameter_count(spec)),
                rt.size(), fsdp::to_string(strategy), mesh->replicate_size(), mesh->shard_size(), io.bytes / 1e6,
                timer.seconds());
    std::fflush(stdout);
  }
}

std::vector<ckpt::ExpectedTensor> expected_tensors(const model::ModelSpec& spec) {
  // The parameters the model has, with their shapes (the model on meta: no memory).
  return expected_tensors(*model::build_model(spec, at::kMeta));
}

std::vector<ckpt::ExpectedTensor> expected_tensors(const model::Model& net) {
  std::vector<ckpt::ExpectedTensor> expected;
  std::set<const void*> seen;  // a tied weight registered twice is one tensor
  const bool adapter = train::is_adapter_run(net.spec());  // its checkpoints hold what trains only
  for (const auto& p : net.named_parameters(/*recurse=*/true)) {
    if (adapter && !p.value().requires_grad()) continue;
    if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    expected.push_back({p.key(), p.value().sizes().vec()});
  }
  return expected;
}

void export_checkpoint(const std::string& path, const std::string& out) {
  ckpt::refuse_overwriting_inputs(out, {path}, "ckpt export");
  const ckpt::CheckpointMeta meta = ckpt::read_checkpoint_meta(path);
  const model::ModelSpec spec = model_spec_from_json(meta.model_spec_json, "checkpoint " + path);
  const std::vector<ckpt::ExpectedTensor> expected = expected_tensors(spec);
  ckpt::export_safetensors(path, out, &expected);
}

}  // namespace shardtrain::model_io
